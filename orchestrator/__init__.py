"""orchestrator — see DESIGN.md."""
