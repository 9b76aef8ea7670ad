"""A local PostgreSQL cluster for a DuckLake catalog: tests and `ahc cluster`-style development setups.

    with LocalPostgres(directory) as pg:      # initdb if new, pg_ctl start on a free (or given) port
        attach_lake(conn, pg.dsn, data_path)  # dsn: "dbname=ahc host=127.0.0.1 port=N user=ahc passfile=…"

The cluster lives in DIRECTORY/pgdata, its Unix socket in DIRECTORY/socket and its log in
DIRECTORY/postgres.log; it listens on 127.0.0.1 only. Every connection, over the socket or TCP,
authenticates with a password (scram-sha-256): the superuser's and the lake role's are generated at
`initdb` and kept in DIRECTORY/pgpass (mode 0600, libpq's password file format), which the
connection string names (`passfile=`), so no password is ever in a DSN, a log line or a process list.
(With trust authentication any local user was a superuser, `COPY … TO PROGRAM` included.) A cluster
made before this, with trust, is moved to passwords at its next start. The directory is 0700.
`initdb` and `pg_ctl` refuse to run as root: as root they run as the `postgres` user (`runuser -u
postgres --`), and the directory is handed to that user.
The binaries are Debian's (/usr/lib/postgresql/<version>/bin, the newest), else those on PATH.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from server.cluster.server_process import free_port

SUPERUSER = "postgres"
START_TIMEOUT_S = 60


def postgres_bin(name: str) -> str:
    """The path of a PostgreSQL program (`initdb`, `pg_ctl`, `psql`, ...): Debian's newest
    /usr/lib/postgresql/<version>/bin first, then PATH. Raises FileNotFoundError naming the package."""
    def version(path: str) -> tuple[int, ...]:
        found = re.search(r"postgresql/([\d.]+)/bin", path)
        return tuple(int(p) for p in found.group(1).split(".") if p) if found else ()

    for candidate in sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=version, reverse=True):
        if os.access(candidate, os.X_OK):
            return candidate
    on_path = shutil.which(name)
    if on_path:
        return on_path
    raise FileNotFoundError(f"PostgreSQL's {name!r} was not found in /usr/lib/postgresql/*/bin or on PATH "
                            "(install the Debian package `postgresql`)")


def postgres_available() -> bool:
    try:
        for name in ("initdb", "pg_ctl", "psql"):
            postgres_bin(name)
    except FileNotFoundError:
        return False
    return True


class LocalPostgres:
    """A PostgreSQL cluster in `directory`, with a login role and a database for the lake (both named
    `user` / `database`). `start()` (or `with`) creates it if new and starts it; `stop()` stops it."""

    def __init__(self, directory: Path | str, *, port: int | None = None, user: str = "ahc",
                 database: str = "ahc") -> None:
        for what, value in (("user", user), ("database", database)):
            if not re.fullmatch(r"[a-z_][a-z0-9_]*", value):
                raise ValueError(f"LocalPostgres {what} {value!r}: use lower-case letters, digits and _")
        self.directory = Path(directory).resolve()
        self.pgdata = self.directory / "pgdata"
        self.socket_dir = self.directory / "socket"
        self.log_file = self.directory / "postgres.log"
        self.passfile = self.directory / "pgpass"
        self.user, self.database = user, database
        self.port = port
        self._started = False
        self._as_postgres = os.geteuid() == 0

    @property
    def dsn(self) -> str:
        """The libpq connection string of the lake's database (what `attach_lake` takes)."""
        if self.port is None:
            raise RuntimeError("LocalPostgres is not started")
        return self._dsn(self.database)

    def _dsn(self, database: str) -> str:
        return f"dbname={database} host=127.0.0.1 port={self.port} user={self.user} passfile={self.passfile}"

    # -- running the binaries ---------------------------------------------------------------------
    def _run(self, name: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = ["env", f"PGPASSFILE={self.passfile}", postgres_bin(name), *args]
        if self._as_postgres:
            command = ["runuser", "-u", SUPERUSER, "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, cwd="/", timeout=START_TIMEOUT_S)
        if check and result.returncode != 0:
            raise RuntimeError(f"PostgreSQL {name} failed (exit {result.returncode}): "
                               f"{(result.stderr or result.stdout).strip()}; see {self.log_file}")
        return result

    def _psql(self, sql: str, database: str = "postgres") -> str:
        return self._run("psql", "-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1", "-h", str(self.socket_dir),
                         "-p", str(self.port), "-U", SUPERUSER, "-d", database, "-c", sql).stdout.strip()

    def _hand_over(self) -> None:
        """As root: the cluster's directories belong to the `postgres` user, who must reach them."""
        if not self._as_postgres:
            return
        shutil.chown(self.directory, SUPERUSER, SUPERUSER)
        for path in (self.pgdata, self.socket_dir, self.log_file, self.passfile):
            if path.exists():
                shutil.chown(path, SUPERUSER, SUPERUSER)
        probe = subprocess.run(["runuser", "-u", SUPERUSER, "--", "test", "-w", str(self.directory)],
                               capture_output=True)
        if probe.returncode != 0:
            raise RuntimeError(f"the `postgres` user cannot write {self.directory} (a parent directory is "
                               "closed to it): put the cluster under a directory it can reach, e.g. in /tmp")

    # -- life ---------------------------------------------------------------------------------------
    def start(self) -> LocalPostgres:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.directory.chmod(0o700)
        self.socket_dir.mkdir(exist_ok=True)
        self.log_file.touch()
        fresh = not (self.pgdata / "PG_VERSION").exists()
        trusting = not fresh and not self.passfile.exists()  # made before passwords: moved to them below
        if not self.passfile.exists():
            self._write_passfile(secrets.token_urlsafe(24), secrets.token_urlsafe(24))
        self._hand_over()
        if fresh:
            self._initdb()
        running = self._running_port()
        if running is not None:  # started earlier and left running: use it as it is
            self.port = running
        else:
            self._start_server()
        if trusting:
            self._require_passwords()
        self._ensure_database()
        return self

    def _password(self, role: str) -> str:
        for line in self.passfile.read_text().splitlines():
            *_, user, password = line.split(":", 4)
            if user == role:
                return password
        raise RuntimeError(f"{self.passfile} holds no password for {role!r}")

    def _write_passfile(self, superuser_password: str, role_password: str) -> None:
        fd = os.open(self.passfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:  # token_urlsafe holds no ':' or '\\' to escape
            out.write(f"*:*:*:{SUPERUSER}:{superuser_password}\n*:*:*:{self.user}:{role_password}\n")

    def _initdb(self) -> None:
        with tempfile.NamedTemporaryFile("w", dir=self.directory, delete=False) as pwfile:
            pwfile.write(self._password(SUPERUSER) + "\n")
        try:
            if self._as_postgres:
                shutil.chown(pwfile.name, SUPERUSER, SUPERUSER)
            self._run("initdb", "-D", str(self.pgdata), "-U", SUPERUSER, "--auth=scram-sha-256",
                      f"--pwfile={pwfile.name}", "-E", "UTF8", "--no-instructions")
        finally:
            os.unlink(pwfile.name)

    def _require_passwords(self) -> None:
        """A cluster made with trust authentication: give the superuser its password, then ask every
        connection for one."""
        self._psql(f"ALTER ROLE {SUPERUSER} PASSWORD '{self._password(SUPERUSER)}'")
        hba = self.pgdata / "pg_hba.conf"
        hba.write_text(re.sub(r"\btrust\s*$", "scram-sha-256", hba.read_text(), flags=re.MULTILINE))
        self._psql("SELECT pg_reload_conf()")

    def _running_port(self) -> int | None:
        if self._run("pg_ctl", "-D", str(self.pgdata), "status", check=False).returncode != 0:
            return None
        lines = (self.pgdata / "postmaster.pid").read_text().splitlines()
        return int(lines[3]) if len(lines) > 3 else None

    def _start_server(self) -> None:
        attempts = 1 if self.port is not None else 3
        for attempt in range(attempts):
            port = self.port if self.port is not None else free_port()
            options = f"-c listen_addresses=127.0.0.1 -p {port} -k {self.socket_dir} -c fsync=on"
            result = self._run("pg_ctl", "-D", str(self.pgdata), "-l", str(self.log_file), "-o", options,
                               "-w", "-t", str(START_TIMEOUT_S), "start", check=False)
            if result.returncode == 0:
                self.port, self._started = port, True
                return
            if attempt == attempts - 1:
                tail = " | ".join(self.log_file.read_text(errors="replace").strip().splitlines()[-5:])
                raise RuntimeError(f"PostgreSQL did not start in {self.pgdata} on port {port}: {tail} "
                                   f"(log: {self.log_file})")
            time.sleep(0.2)  # a port taken between free_port() and the bind: try another

    def _ensure_database(self) -> None:
        password = self._password(self.user)
        if self._psql(f"SELECT 1 FROM pg_roles WHERE rolname = '{self.user}'") != "1":
            self._psql(f"CREATE ROLE {self.user} LOGIN PASSWORD '{password}'")
        else:
            self._psql(f"ALTER ROLE {self.user} PASSWORD '{password}'")
        self.create_database(self.database)

    def create_database(self, name: str) -> str:
        """Another database of the lake's role in this cluster (kept if it exists): a second lake, or a
        fresh one per test. Returns its connection string."""
        if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
            raise ValueError(f"database name {name!r}: use lower-case letters, digits and _")
        if self._psql(f"SELECT 1 FROM pg_database WHERE datname = '{name}'") != "1":
            self._psql(f"CREATE DATABASE {name} OWNER {self.user}")
        return self._dsn(name)

    def stop(self) -> None:
        """Stop the server if this object started it (a fast shutdown: open sessions are ended)."""
        if self._started:
            self._started = False
            self._run("pg_ctl", "-D", str(self.pgdata), "-m", "fast", "-w", "stop", check=False)

    def __enter__(self) -> LocalPostgres:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.stop()
