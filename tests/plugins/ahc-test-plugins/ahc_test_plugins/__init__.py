"""AHC's test plug-ins: `bracket` (a formatter), `workspace` (an artifact injector), and two broken formatters."""
