"""XDB's audit room: see README.md beside this file."""
