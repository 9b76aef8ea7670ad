"""An emulated GPU engine: vLLM's own scheduler, KV cache manager (prefix caching, LRU eviction,
preemption), output processing and OpenAI layer, with the forward pass replaced by a wait from a
roofline cost model of a named GPU and model (roofline.py, profiles.py) and token ids drawn
deterministically (executor.py). Serving figures measured on it are labelled "emulated" everywhere."""
