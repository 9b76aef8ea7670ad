"""xdb — see DESIGN.md."""
