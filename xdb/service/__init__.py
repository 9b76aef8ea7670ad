"""XDB's service room: see README.md beside this file."""
