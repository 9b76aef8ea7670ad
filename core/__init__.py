"""What every package of AHC builds on and nothing of AHC's own: the configuration (config.py), the
errors (errors.py), the input limits (limits.py) and the tracing span names (spans.py)."""
