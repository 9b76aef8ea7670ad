"""What the server does to XDB while serving: every token recorded, retention and the byte quota, backups on SIGUSR1."""
