"""Logs and traces: AHC's loggers on vLLM's handlers, its spans in vLLM's traces, each chat request's line and span."""
