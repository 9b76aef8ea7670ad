"""The context orchestrator: prompts assembled from blocks, sessions, CAG/RAG, governors, compaction
(see orchestrator/README.md)."""
