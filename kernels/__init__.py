"""GPU kernels (Triton).

transformers probes for a top-level module named ``kernels`` (Hugging Face's kernel hub) and imports
this one when it finds it, so this file must stay free of heavy imports and side effects.
"""
