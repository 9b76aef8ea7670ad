"""XDB in a process of its own: the service, its link, the remote writer and RemoteXDB, the spill (README.md)."""
