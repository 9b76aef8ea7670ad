"""XDB's recall room: see README.md beside this file."""
