"""A whole cluster on one machine, for development and tests: the lake's catalog, N `ahc serve`
replicas and vLLM's router in front of them.

    with LocalCluster(ClusterSpec(data_dir, replicas=2, model="...")) as cluster:
        client = openai.OpenAI(base_url=cluster.url + "/v1", default_headers={"X-Session-ID": "agent-1"})

Layout under `data_dir`: `catalog/` (PostgreSQL, unless `catalog` names a running one or `catalog_dir`
puts it elsewhere), `lake/` (the
lake's Parquet files), `replica-<i>/xdb` (each replica's local XDB, its hot buffer) with its log
`replica-<i>/server.log`, and `router.log`. Replica i listens on `replica_base_port + i`, the router on a
private loopback port, and a guard (server/cluster/router_guard.py) on `port`: clients reach the API's
routes, never the router's own (add_worker, ...). The replicas are started together (their model loads
overlap), then the router, which hashes `X-Session-ID` (`consistent_hash`) so each session stays on the
replica that holds its prefix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from server.cluster.catalog import LocalPostgres
from server.cluster.router import POLICIES, Policy, RouterProcess, RouterSpec
from server.cluster.router_guard import GuardServer
from server.cluster.server_process import AHC, ServerProcess, free_port, start_process, wait_healthy


@dataclass(frozen=True)
class ClusterSpec:
    data_dir: Path
    replicas: int = 2
    model: str | None = None  # else the config's
    config: str | None = None  # `ahc serve --config`: a file or a bundled example
    host: str = "127.0.0.1"
    port: int = 8000  # the router's: what clients use
    replica_base_port: int | None = None  # replica i on this + i; None: free ports
    policy: Policy = "consistent_hash"
    lake: bool = True  # one experience lake (xdb.backend ducklake); False: each replica its own XDB
    catalog: str | None = None  # a running PostgreSQL's libpq string; None: one started in catalog_dir
    # Where that PostgreSQL keeps its files (default data_dir/catalog). As root it runs as the `postgres`
    # user, who must be able to reach it: not under a 0700 home or temp directory.
    catalog_dir: Path | None = None
    serve_args: tuple[str, ...] = ()  # further `ahc serve` / `vllm serve` flags for every replica
    api_key: str | None = None
    env: dict[str, str] = field(default_factory=dict)  # for every replica, on top of this process's

    def __post_init__(self) -> None:
        if not 1 <= self.replicas <= 64:
            raise ValueError(f"replicas must be 1 to 64, not {self.replicas}")
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, not {self.policy!r}")
        for name, port in (("port", self.port), ("replica_base_port", self.replica_base_port)):
            if port is not None and not 1 <= port <= 65535 - self.replicas:
                raise ValueError(f"{name} {port} is not a usable port")


def replica_id(index: int) -> str:
    return f"replica-{index}"


class LocalCluster:
    """Start with `start()` or `with`; `stop()` stops the router, then the replicas (they drain), then
    the catalog it started. `kill(i)` is SIGKILL to one replica, for failover drills."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.data_dir = Path(spec.data_dir).resolve()
        self.catalog: LocalPostgres | None = None
        self.dsn = spec.catalog
        self.replicas: list[ServerProcess] = []
        self.router: RouterProcess | None = None
        self.guard: GuardServer | None = None

    @property
    def url(self) -> str:
        return f"http://{self.spec.host}:{self.spec.port}"

    @property
    def lake_path(self) -> Path:
        return self.data_dir / "lake"

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> LocalCluster:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        try:
            if self.spec.lake and self.dsn is None:
                self.catalog = LocalPostgres(self.spec.catalog_dir or self.data_dir / "catalog").start()
                self.dsn = self.catalog.dsn
            self.replicas = self._start_replicas()
            self.router = RouterProcess(self.router_spec(), self.data_dir / "router.log").start()
            # Clients reach the router through the guard only: its own routes (add_worker, ...) stay private.
            self.guard = GuardServer(self.router.spec.url, self.spec.host, self.spec.port,
                                     api_keys=[self.spec.api_key] if self.spec.api_key else []).start()
        except BaseException:
            self.stop()
            raise
        return self

    def router_spec(self) -> RouterSpec:
        # On a private loopback port, behind the guard on the cluster's port (server/cluster/router_guard.py).
        # The router always serves its own metrics too: a port of its own, so two routers can share a host.
        return RouterSpec(worker_urls=tuple(r.base_url for r in self.replicas), policy=self.spec.policy,
                          host="127.0.0.1", port=free_port(), metrics_port=free_port())

    def replica_env(self, index: int) -> dict[str, str]:
        env = dict(self.spec.env)
        if self.spec.lake:
            assert self.dsn is not None
            env |= {"AHC_XDB__BACKEND": "ducklake", "AHC_XDB__LAKE__CATALOG": self.dsn,
                    "AHC_XDB__LAKE__DATA_PATH": str(self.lake_path), "AHC_XDB__LAKE__REPLICA_ID": replica_id(index)}
        return env

    def replica_command(self, index: int, port: int) -> list[str]:
        spec = self.spec
        cmd = [AHC, "serve", *([spec.model] if spec.model else []), "--host", "127.0.0.1", "--port", str(port),
               "--data-dir", str(self.data_dir / replica_id(index) / "xdb")]
        if spec.config:
            cmd += ["--config", spec.config]
        if spec.api_key:
            cmd += ["--api-key", spec.api_key]
        return cmd + list(spec.serve_args)

    def _start_replicas(self) -> list[ServerProcess]:
        """All at once, then each waited for: their model loads overlap."""
        base = self.spec.replica_base_port
        started: list[ServerProcess] = []
        for i in range(self.spec.replicas):
            port = base + i if base is not None else free_port()
            started.append(self._launch(i, port))
        self.replicas = started  # so a failed wait still stops them all
        return [wait_healthy(r, timeout=600) for r in started]

    def _launch(self, index: int, port: int) -> ServerProcess:
        log = self.data_dir / replica_id(index) / "server.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a") as out:
            process = start_process(self.replica_command(index, port), out, self.replica_env(index))
        return ServerProcess(process, port, log, self.spec.api_key, self.data_dir / replica_id(index) / "xdb")

    def restart(self, index: int) -> ServerProcess:
        """Replica `index` again, on its port and data (after a kill, say); the router finds it by health."""
        old = self.replicas[index]
        old.stop()
        self.replicas[index] = wait_healthy(self._launch(index, old.port), timeout=600)
        return self.replicas[index]

    def kill(self, index: int) -> None:
        process = self.replicas[index].process
        process.kill()
        process.wait()

    def stop(self) -> None:
        if self.guard is not None:
            self.guard.stop()
            self.guard = None
        if self.router is not None:
            self.router.stop()
            self.router = None
        for replica in self.replicas:
            replica.stop()
        if self.catalog is not None:
            self.catalog.stop()
            self.catalog = None


def cluster_spec_from_cli(data_dir: str, replicas: int, model: str | None, config: str | None, host: str,
                          port: int, replica_base_port: int | None, policy: str, lake: bool, catalog: str | None,
                          catalog_dir: str | None, api_key: str | None, serve_args: Sequence[str]) -> ClusterSpec:
    """What `ahc cluster` was given, checked (a ValueError names what is wrong)."""
    if policy not in POLICIES:  # said here with the flag's name; ClusterSpec checks it for Python callers
        raise ValueError(f"--policy must be {' or '.join(POLICIES)}, not {policy!r}")
    return ClusterSpec(Path(data_dir), replicas=replicas, model=model, config=config, host=host, port=port,
                       replica_base_port=replica_base_port, policy=policy,  # type: ignore[arg-type]
                       lake=lake, catalog=catalog, catalog_dir=Path(catalog_dir) if catalog_dir else None,
                       api_key=api_key, serve_args=tuple(serve_args))
