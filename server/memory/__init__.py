"""XDB's memory verbs offered to a model: run for a tool call the model made (`POST /v1/context/memory`),
and served over the Model Context Protocol (`ahc mcp`) to clients that bring their own tools."""
