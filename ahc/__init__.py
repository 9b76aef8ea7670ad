"""AHC: the command line, configuration and the tiny model builder."""
