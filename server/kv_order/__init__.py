"""Which sessions' KV vLLM keeps: plug-ins loaded inside vLLM's engine core by its public extension
points (the CPU tier's `cache_policy_module_path`, `--scheduler-cls`), and the hint AHC sends them."""
