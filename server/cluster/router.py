"""Start and stop vLLM's router (`vllm-router==0.1.17`) in front of several `ahc serve` replicas.

What the router does, as measured against fake workers (tests/test_router.py shows each point):

- CLI: `vllm-router --worker-urls URL... --policy P --host H --port N`. Policies: `consistent_hash`,
  `round_robin`, `random`, `cache_aware` (its default), `power_of_two`, `kv_aware`,
  `sticky_least_loaded`. It always serves Prometheus metrics on `--prometheus-host/--prometheus-port`
  (127.0.0.1:29000 by default); a port in use makes it exit, so two routers on a host need two ports.
  `--log-level debug|info|warning|error|critical` (info logs three lines per routed request).
- Start: it listens only once one worker answers GET /health with 2xx (checked every
  `--worker-startup-check-interval` s, 30 by default, so we pass 1), and exits with status 1 after
  `--worker-startup-timeout-secs`. Workers are probed on /health only, never /v1/models. Its own
  routes: /liveness (always 200), /readiness (200 while one worker is healthy, else 503), /health
  (503 while any worker is unhealthy), /workers (JSON, each worker's `is_healthy`).
- consistent_hash keys on the first non-empty header of x-session-id, x-user-id, x-tenant-id,
  x-correlation-id, x-request-id, x-trace-id (case-insensitive; the key includes the header's name).
  Body fields (`user`, `context.session_id`, ...) are NOT read: a request with none of those headers is
  keyed `request:` and every such request goes to one worker. A client that sends a per-request
  X-Request-ID without X-Session-ID is spread at random. The ring (160 virtual nodes per worker URL
  string) is built over the workers healthy at the time: a dead worker's sessions spread over the
  survivors, the others stay put, and they all move back once it is healthy again.
- The body is parsed into the router's typed chat request and re-serialised: unknown top-level fields
  (AHC's `context`) arrive equal as JSON (key order kept), but it adds defaults (`stream`, `logprobs`,
  `ignore_eos`, `skip_special_tokens`, `include_reasoning`, `continue_final_message`, and SGLang's
  `no_stop_trim`, `separate_reasoning`, `stream_reasoning`, `return_hidden_states`, which vLLM ignores),
  rewrites messages (unknown message fields dropped, `content: null` dropped, `reasoning_content`
  renamed `reasoning`), and turns integers beyond 64 bits into floats. `model` is not required; a body
  without `messages` is refused by the router itself (422, text/plain, not OpenAI's error shape).
- Headers: every request header is forwarded (Authorization, traceparent, X-Session-ID, X-Request-ID)
  but Host. Every response header of the worker reaches the client (X-Session-ID included) but
  hop-by-hop ones; the router adds `x-request-id` and CORS headers (`access-control-allow-origin: *`
  unless `--cors-allowed-origins`).
- Errors and retries: a worker's status and body pass through unchanged. 408, 429, 500, 502, 503 and
  504 are retried, on the worker the policy picks again (the same one, for a session), up to
  `--retry-max-retries` attempts in all, with exponential backoff that ignores Retry-After; a refused
  connection is a 500 to the router, so it is retried too. The price of failover: a 5xx is a generation
  replayed, and AHC's own back-pressure (429 after `vram_queue_timeout_s` and a compaction, 503 while XDB
  is behind) is waited for once per attempt before the client sees it (set retry_max_retries=1 to stop
  both, and let clients retry).
- `--request-timeout-secs` bounds a whole request, stream included: a longer stream is cut mid-body, and
  a non-streamed request over it becomes a 500 ("Request failed"), which is retried like any 500.
- Circuit breaker (on by default): 10 consecutive failed attempts open a worker's circuit for 60 s. As
  a failed request is 5 attempts (the router's default), two requests in a row that end in a 500 take a
  replica out, and four take out a cluster of two ("No available workers", 503, for a minute). We turn
  it off: the health checks alone decide which workers get traffic.
- Failover, with this module's defaults (health checks every 1 s, one failure marks a worker
  unhealthy; retries after 100, 200, 400, 800, 1000 ms, 6 attempts): after a SIGKILL of one of three
  workers no request failed; the first request of a moved session succeeded 0.7 to 1.7 s after the kill
  (on a 2-core machine under load: the request waits in the router's retries until the health check has
  seen the death, then for the next retry); each moved session stayed on one survivor, the others never
  moved, and they all went back within about 1 s of the restarted worker answering /health. A stream in
  flight on the killed worker is cut (an incomplete chunked body, no `[DONE]`). With the router's own
  defaults (health checks every 60 s, the circuit breaker) the first two requests to the dead worker's
  sessions failed (500), then the circuit, not the health check, moved them.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal
from urllib.parse import urlsplit

Policy = Literal["consistent_hash", "round_robin"]
POLICIES: tuple[str, ...] = ("consistent_hash", "round_robin")
LOG_LEVELS: tuple[str, ...] = ("debug", "info", "warning", "error", "critical")
EXECUTABLE = "vllm-router"
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class RouterSpec:
    """One router: its workers, its policy, where it listens, and how fast it gives up on a worker."""

    worker_urls: tuple[str, ...]  # http(s)://host:port, no path; spelled the same on every start (the ring hashes it)
    policy: Policy = "consistent_hash"
    host: str = "127.0.0.1"
    port: int = 8000
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 29000  # the router always serves Prometheus metrics; one port per router on a host
    # Health checks alone decide which workers get traffic (the circuit breaker is off, see above). A dead
    # worker refuses connections at once, so the interval is the detection time; the timeout only
    # matters for a hung one and tolerates a /health stalled up to 2 s.
    health_check_interval_s: int = 1
    health_check_timeout_s: int = 2
    health_failure_threshold: int = 1
    health_success_threshold: int = 2  # a restarted worker gets its sessions back after 2 good checks
    # Backoff 100, 200, 400, 800, 1000 ms: the retries of a request to a just-dead worker outlast the health
    # check's detection (1 s, more on a loaded host) with room to spare, so a later attempt goes to a
    # survivor and the client never sees the death.
    retry_max_retries: int = 6  # attempts in all, the first included
    retry_initial_backoff_ms: int = 100
    retry_backoff_multiplier: float = 2.0
    retry_max_backoff_ms: int = 1000
    circuit_breaker: bool = False
    request_timeout_s: int = 1800  # a whole request, stream included: the longest generation we allow
    worker_startup_timeout_s: int = 600  # the router exits when no worker is healthy by then
    log_level: str = "warning"  # info logs three lines per routed request
    extra_args: tuple[str, ...] = ()  # any other vllm-router flag, appended as given

    def __post_init__(self) -> None:
        _check_spec(self)
        # A list is welcome too; kept as a tuple so the spec stays immutable and hashable.
        object.__setattr__(self, "worker_urls", tuple(self.worker_urls))
        object.__setattr__(self, "extra_args", tuple(self.extra_args))

    @property
    def url(self) -> str:
        """Where clients reach the router (a wildcard bind is reached on loopback)."""
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(self.host, self.host)
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"


def _check_spec(spec: RouterSpec) -> None:
    if isinstance(spec.worker_urls, str) or not spec.worker_urls:
        raise ValueError("worker_urls must be a non-empty tuple of URLs")
    for url in spec.worker_urls:
        _check_worker_url(url)
    if len(set(spec.worker_urls)) != len(spec.worker_urls):
        raise ValueError(f"worker_urls has duplicates: {list(spec.worker_urls)}")
    if spec.policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {spec.policy!r}")
    for name in ("port", "metrics_port"):
        _check_port(name, getattr(spec, name))
    if spec.port == spec.metrics_port:
        raise ValueError(f"port and metrics_port must differ, both are {spec.port}")
    for name in ("health_check_interval_s", "health_check_timeout_s", "health_failure_threshold",
                 "health_success_threshold", "retry_max_retries", "retry_initial_backoff_ms",
                 "retry_max_backoff_ms", "request_timeout_s", "worker_startup_timeout_s"):
        value = getattr(spec, name)
        # The router takes whole numbers only (and a 0 s interval would spin).
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if spec.retry_backoff_multiplier < 1:
        raise ValueError(f"retry_backoff_multiplier must be >= 1, got {spec.retry_backoff_multiplier!r}")
    if spec.log_level not in LOG_LEVELS:
        raise ValueError(f"log_level must be one of {LOG_LEVELS}, got {spec.log_level!r}")
    if isinstance(spec.extra_args, str):
        raise ValueError("extra_args must be a tuple of strings, not one string")


def _check_worker_url(url: str) -> None:
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"worker URL must look like http://host:port, got {url!r}")
    try:
        parts.port  # noqa: B018 - parsing the port is the check
    except ValueError as exc:
        raise ValueError(f"worker URL {url!r} has a bad port: {exc}") from None
    # The router appends the route to the URL as given: a path (even "/") would break every request.
    if parts.path or parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError(f"worker URL must be only scheme://host:port, got {url!r}")


def _check_port(name: str, port: int) -> None:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"{name} must be an integer in 1..65535, got {port!r}")


def router_executable() -> str:
    """The `vllm-router` launcher the wheel installs: beside this interpreter (the same virtualenv), or on PATH."""
    beside = Path(sys.executable).with_name(EXECUTABLE)  # not resolved: a venv's python is a symlink
    if beside.is_file():
        return str(beside)
    found = shutil.which(EXECUTABLE)
    if found is None:
        raise FileNotFoundError(f"{EXECUTABLE} is not installed beside {sys.executable} nor on PATH: "
                                f"pip install vllm-router==0.1.17")
    return found


def router_command(spec: RouterSpec, executable: str | None = None) -> list[str]:
    """The command line that runs `spec`."""
    cmd = [executable or router_executable(),
           "--worker-urls", *spec.worker_urls,
           "--policy", spec.policy,
           "--host", spec.host, "--port", str(spec.port),
           "--prometheus-host", spec.metrics_host, "--prometheus-port", str(spec.metrics_port),
           # At 30 s (its default) one early miss while the replicas boot delays the router by 30 s.
           "--worker-startup-check-interval", "1",
           "--worker-startup-timeout-secs", str(spec.worker_startup_timeout_s),
           "--health-check-interval-secs", str(spec.health_check_interval_s),
           "--health-check-timeout-secs", str(spec.health_check_timeout_s),
           "--health-failure-threshold", str(spec.health_failure_threshold),
           "--health-success-threshold", str(spec.health_success_threshold),
           "--retry-max-retries", str(spec.retry_max_retries),
           "--retry-initial-backoff-ms", str(spec.retry_initial_backoff_ms),
           "--retry-backoff-multiplier", str(spec.retry_backoff_multiplier),
           "--retry-max-backoff-ms", str(spec.retry_max_backoff_ms),
           "--request-timeout-secs", str(spec.request_timeout_s),
           "--log-level", spec.log_level]
    if not spec.circuit_breaker:
        cmd.append("--disable-circuit-breaker")
    return cmd + list(spec.extra_args)


class RouterProcess:
    """A running router: `with RouterProcess(spec, log_path) as router: ... router.url ...`.

    `start` returns once GET /readiness answers 200 (the router listens only after a worker is healthy);
    a router that exits first, or is not ready within `startup_timeout_s`, is a RuntimeError naming its log.
    """

    def __init__(self, spec: RouterSpec, log_path: Path, *, startup_timeout_s: float = 60.0,
                 executable: str | None = None) -> None:
        self.spec = spec
        self.log_path = Path(log_path)
        self.startup_timeout_s = startup_timeout_s
        self.executable = executable
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return self.spec.url

    def __enter__(self) -> RouterProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> RouterProcess:
        if self.process is not None:
            raise RuntimeError("this router was already started")
        cmd = router_command(self.spec, self.executable)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        try:
            self.process = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log,
                                            stderr=subprocess.STDOUT)
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vllm-router exited with {self.process.returncode} before it was ready; "
                                   f"its log: {self.log_path}\n{self.log_tail()}")
            if _answers_200(f"{self.url}/readiness"):
                return
            time.sleep(0.1)
        raise RuntimeError(f"vllm-router not ready after {self.startup_timeout_s} s; its log: {self.log_path}\n"
                           f"{self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the log, without the colour codes the router writes even into a file."""
        try:
            return ANSI_ESCAPE.sub("", self.log_path.read_text(errors="replace"))[-chars:]
        except OSError:
            return ""

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM (it drains), SIGKILL after `timeout_s`; returns the exit status (None if never started)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        return None if self.process is None else self.process.returncode


def _answers_200(url: str) -> bool:
    # No proxy: an HTTP_PROXY in the environment must not carry a loopback poll away.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False
