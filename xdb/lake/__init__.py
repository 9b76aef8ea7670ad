"""XDB's lake room: see README.md beside this file."""
