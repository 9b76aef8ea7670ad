"""How the history is kept: fidelity tiers, compression, retention, sealed segments, vacuum, backups (README.md)."""
