"""The HTTP edge every route shares: the gateway (AHC's one ASGI layer), OpenAI-shaped errors, body size and
type, the session a request names."""
