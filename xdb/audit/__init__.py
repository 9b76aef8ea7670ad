"""The audit log: the hash chain over everything XDB stores, its keys, seals and verification (README.md)."""
