"""AHC's own ground and top: `core` (the configuration, the errors, the limits and span names, which
every package builds on and which import nothing of AHC's) and `ahc.cli` (the `ahc` command, which
imports everything); `configs/` and `data/` ship as package data."""
