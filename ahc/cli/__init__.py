"""The `ahc` command (app.py), on top of everything: it starts the server, the agent, the benches and
the tools that make models (tiny_model.py, model_pull.py); identity.py asks a running server to condense
an Identity."""
