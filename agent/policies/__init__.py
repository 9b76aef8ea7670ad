"""Policies: who decides the next experiment. `baseline` designs it algorithmically, `llm` asks the
model through the server."""
