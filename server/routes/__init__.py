"""AHC's HTTP routes beside the chat route: /v1/xdb/*, /v1/context/*, /v1/completions and the /ui/ page."""
