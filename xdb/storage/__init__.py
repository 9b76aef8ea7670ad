"""XDB's storage room: see README.md beside this file."""
