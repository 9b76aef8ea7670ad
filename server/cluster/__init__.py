"""Several `ahc serve` replicas behind vLLM's router: session affinity by the `X-Session-ID` header."""
