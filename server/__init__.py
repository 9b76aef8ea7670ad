"""The HTTP server: vLLM's OpenAI app around an in-process engine, plus AHC's routes and metrics."""
