"""The HTTP edge every route shares: OpenAI-shaped errors, body size and type, the session a request names."""
