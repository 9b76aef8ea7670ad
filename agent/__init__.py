"""The discovery agent (`ahc discover`): a Popperian scientist reverse-engineering a hidden universe
through the harness tools, with a three-tier context kept cache-friendly by the server's orchestrator
and every turn recorded in XDB."""
