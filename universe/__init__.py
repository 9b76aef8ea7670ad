"""universe — see DESIGN.md."""
