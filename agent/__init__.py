"""The discovery agent (issue 7, seeds 000/001, SPEC §2 `ahc discover` and §6): a Popperian scientist
reverse-engineering a hidden universe through the harness tools, with a three-tier context kept
cache-friendly by the server's orchestrator and every turn recorded in XDB."""
