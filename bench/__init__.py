"""Benchmarks: each measures our path and its reference side by side in one run."""
