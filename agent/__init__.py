"""agent — see DESIGN.md."""
