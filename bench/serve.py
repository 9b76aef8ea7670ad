"""`ahc bench serve`: AHC's server against vLLM's own OpenAI api_server, same model, same engine flags,
same load, in one run; or the same load on any running server (`--base-url`).

vLLM runs `python -m vllm.entrypoints.openai.api_server` with the very flags `ahc serve` gives its
engine (server/engine_args.py over configs/cpu-tiny.yaml); AHC runs as a user runs it: every token,
input and reply recorded into XDB, concept activations captured in the engine (a lens pack built for
the bench model). The load is a profile (bench/serve_profiles.py, `--profile` or `BENCH_SERVE_LOAD`):
concurrent streaming chat clients, every reply exactly `max_tokens` long (`ignore_eos`), short distinct
prompts.

Both servers are up together and measured in alternating rounds, so the machine's drift falls on both
alike. Per server: completion tokens per second of wall time and the API process's CPU per generated
token (user + system of that one process over the round; vLLM's EngineCore is a child process and not
counted), each the median round; TTFT and inter-token latency percentiles over all measured rounds'
replies (bench/stream_load.py). After every AHC round its recording is checked over HTTP (one
`output` row per completion token, in each reply's own XDB session); after AHC stops, its audit chain
is verified with `ahc xdb verify-audit` (DuckDB locks the file while the server holds it).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import httpx
import psutil

from bench.device import engine_device
from bench.models import SERVED
from bench.options import BadOptions
from bench.result import BenchResult
from bench.rounds import alternating_rounds
from bench.serve_profiles import LOADS as LOADS  # the registry finds a bench's loads in its module
from bench.serve_profiles import SCALING_ROUNDS, Profile
from bench.servers import start_server, start_together, stop_together
from bench.stream_load import Load, Round, Target, latency_ms, measure
from core.config import load_config
from server.cluster.server_process import AHC, ServerProcess, child_env, free_port, launch
from xdb.service.service import PROCESS_TITLE

MAX_MODEL_LEN = 2048
RECALL_LIMIT = 10_000  # /v1/xdb/recall's most rows; a reply here is far shorter


def start_vllm(model_dir: Path, log_dir: Path, max_num_seqs: int | None = None,
               max_model_len: int = MAX_MODEL_LEN, emulate: str | None = None,
               reply_tokens: int | None = None, extra: Sequence[str] = ()) -> ServerProcess:
    """vLLM's own OpenAI server with the engine flags `ahc serve` would use for this model (on the
    emulated engine `emulate` names, if any, its replies ending after `reply_tokens` on average), and
    `extra` vLLM flags after them."""
    from server.engine_args import vllm_cli_args

    port = free_port()
    overrides = {"engine.max_model_len": max_model_len, "engine.max_num_seqs": max_num_seqs,
                 "engine.emulate": emulate, "engine.emulate_reply_tokens": reply_tokens}
    config = load_config("cpu-tiny").with_overrides(
        model=str(model_dir), port=port, **overrides)
    env = {"VLLM_CPU_KVCACHE_SPACE": str(config.engine.cpu_kvcache_space_gib)}
    # `vllm serve` runs several API processes for --api-server-count; vLLM's API server module, only one.
    entry = "bench.vllm_serve" if "--api-server-count" in extra else "vllm.entrypoints.openai.api_server"
    return launch([sys.executable, "-m", entry, *vllm_cli_args(config), *extra], port,
                  log_dir / "vllm.log", env=env, timeout=600)


@dataclass
class Side:
    """One server under load. `prefix` starts its figures' names ("ahc_", "vllm_", or "" for a server
    given by URL)."""

    prefix: str
    target: Target
    check_xdb: bool = False  # AHC's: every round's recording is checked
    recorded_rows: int = 0
    rows_with_activations: int = 0
    audit: str | None = None  # `ahc xdb verify-audit`'s verdict, once the server has stopped
    children: int | None = None  # processes under the API process (vLLM's EngineCore), not measured

    def measure(self, load: Load) -> Round:
        if self.target.pid and self.children is None:
            self.children = len(psutil.Process(self.target.pid).children(recursive=True))
        target = self.target
        if target.pid:
            xdb_pid = xdb_service_pid(target.pid) if self.check_xdb else None
            children = psutil.Process(target.pid).children(recursive=True)
            api = tuple(c.pid for c in children if API_PROCESS_TITLE in " ".join(c.cmdline()))
            # With several API processes the server's own process only supervises: counted with the engine's.
            engine = tuple(c.pid for c in children if c.pid != xdb_pid and c.pid not in api) + (
                (target.pid,) if api else ())
            target = dataclasses.replace(target, xdb_pid=xdb_pid, engine_pids=engine, api_pids=api)
        result = measure(target, load)
        if self.check_xdb or any(r.session_id for r in result.replies):
            self.check_recording(result)
        return result

    def check_recording(self, result: Round) -> None:
        """Every completion token of the round is an `output` row of its reply's XDB session."""
        headers = {"Authorization": f"Bearer {self.target.api_key}"} if self.target.api_key else {}
        with httpx.Client(base_url=self.target.base_url, headers=headers, timeout=120) as http:
            for reply in result.replies:
                if reply.session_id is None:
                    raise RuntimeError("serve bench: an AHC reply named no XDB session in its `context`")
                response = http.get("/v1/xdb/recall", params={"session_id": reply.session_id,
                                                              "event_types": "output", "limit": RECALL_LIMIT})
                response.raise_for_status()
                rows = response.json()["data"]
                if len(rows) != reply.completion_tokens:
                    raise RuntimeError(f"serve bench: session {reply.session_id} has {len(rows)} output rows "
                                       f"in XDB for {reply.completion_tokens} completion tokens")
                self.recorded_rows += len(rows)
                self.rows_with_activations += sum(1 for row in rows if row["concept_activations"])


@contextmanager
def side_by_side(profile: Profile, max_num_seqs: int | None, api_servers: int = 1) -> Iterator[list[Side]]:
    """vLLM's server and AHC's on the profile's model, up together, each with `api_servers` API processes;
    AHC's audit chain is verified once both have stopped."""
    served = SERVED[profile.model]
    model_dir = served.ensure()
    # An emulated engine runs no model: its executor draws the activations and ships them as the capture
    # worker would, so the API process joins and records them all the same.
    lens = str(served.ensure_lens())
    extra = ["--max-model-len", str(profile.max_model_len)]
    if max_num_seqs:
        extra += ["--max-num-seqs", str(max_num_seqs)]
    if profile.emulate:
        extra += ["--emulate", profile.emulate]
    processes = ["--api-server-count", str(api_servers)] if api_servers > 1 else []
    with tempfile.TemporaryDirectory() as tmp:
        servers = start_together([partial(start_vllm, model_dir, Path(tmp) / "vllm", max_num_seqs,
                                          profile.max_model_len, profile.emulate, extra=processes),
                                  partial(start_server, Path(tmp) / "ahc", model=model_dir, lens=lens,
                                          extra=extra + processes)])
        try:
            model = httpx.get(f"{servers[0].base_url}/v1/models", timeout=60).json()["data"][0]["id"]
            sides = [Side("vllm_", Target(servers[0].base_url, model, pid=servers[0].process.pid)),
                     Side("ahc_", Target(servers[1].base_url, model, pid=servers[1].process.pid), check_xdb=True)]
            yield sides
        finally:
            stop_together(servers)
        sides[1].audit = verify_audit(Path(tmp) / "ahc")


def verify_audit(data_dir: Path) -> str:
    result = subprocess.run([AHC, "xdb", "verify-audit", "--data-dir", str(data_dir)], capture_output=True,
                            text=True, env=child_env(), timeout=600)
    if result.returncode != 0:
        raise RuntimeError(f"serve bench: AHC's audit chain does not verify: {result.stderr.strip()}")
    return result.stdout.strip()


# vLLM's title for each of several API processes (`VLLM::APIServer_0`, ...), AHC's and vLLM's alike.
API_PROCESS_TITLE = "APIServer"


def xdb_service_pid(api_pid: int) -> int | None:
    """AHC's XDB service: the server process's child with its process title (None: XDB runs in-process)."""
    for child in psutil.Process(api_pid).children():
        if PROCESS_TITLE in " ".join(child.cmdline()):
            return child.pid
    return None


def side_figures(side: Side, rounds: Sequence[Round]) -> dict[str, float]:
    p = side.prefix
    figures = {f"{p}tok_per_s": statistics.median(r.tok_per_s for r in rounds)}
    cpu = [r.cpu_us_per_token for r in rounds]
    if all(c is not None for c in cpu):
        figures[f"{p}cpu_us_per_token"] = statistics.median(c for c in cpu if c is not None)
    for name in ("xdb_cpu_us_per_token", "engine_cpu_us_per_token", "cpu_us_per_request"):
        values = [getattr(r, name) for r in rounds]
        if all(v is not None for v in values):
            figures[f"{p}{name}"] = statistics.median(v for v in values if v is not None)
    for process in rounds[0].cores:
        figures[f"{p}{process}_cores"] = statistics.median(r.cores[process] for r in rounds)
    figures.update({f"{p}{name}": value for name, value in latency_ms(rounds).items()})
    figures[f"{p}tokens_per_chunk"] = sum(r.tokens for r in rounds) / max(sum(r.chunks for r in rounds), 1)
    return figures


def side_notes(side: Side, rounds: Sequence[Round]) -> dict[str, str]:
    name = side.prefix.rstrip("_") or "server"
    notes = {f"rounds_{name}": ", ".join(f"{r.tok_per_s:.1f}" for r in rounds),
             f"client_cpu_us_per_token_{name}": f"{statistics.median(r.client_cpu_us_per_token for r in rounds):.1f}"}
    if side.target.pid:
        notes[f"cpu_{name}"] = (f"API process (pid {side.target.pid}) only, user+system; its "
                                f"{side.children} child processes apart: the XDB service (xdb_cpu_*) and the "
                                "engine core with any other (engine_cpu_*); *_cores: CPU seconds over wall "
                                "seconds, per process, the load generator's as client_cores")
        if side.check_xdb:
            notes[f"xdb_cpu_{name}"] = ("AHC's XDB service process (the database, its writer, the audit chain), "
                                        "measured apart from the API process: xdb_cpu_us_per_token")
    if side.recorded_rows:
        notes[f"xdb_{name}"] = (f"every round checked: {side.recorded_rows} output rows for as many completion "
                                f"tokens, {side.rows_with_activations} with concept activations")
    if side.audit:
        notes[f"audit_{name}"] = f"after the server stopped: {side.audit}"
    return notes


def load_of(profile: Profile, clients: int | None = None) -> Load:
    return Load(clients or profile.clients, profile.requests, profile.max_tokens)


def common_notes(profile: Profile, load: Load, rounds: int) -> dict[str, str]:
    device = (f"EMULATED {profile.emulate} (server/emulation/; API processes on this machine's CPU)"
              if profile.emulate else engine_device())
    return {"profile": profile.name, "model": profile.description, "device": device,
            "load": f"{load.clients} streaming clients x {load.requests} chat requests x {load.max_tokens} tokens "
                    f"(ignore_eos), one asyncio client; {rounds} measured rounds after a warm-up each",
            "latency": "TTFT: request sent to first content chunk; ITL: gaps between content chunks; end_wait: "
                       "last content chunk to the stream's end (AHC holds the finish for the reply's commit); "
                       "percentiles over every reply of the measured rounds"}


def run(load: Profile, rounds: int | None = None, base_url: str | None = None, model: str | None = None,
        api_key: str | None = None, pid: int | None = None, api_server_count: int = 1, scaling: bool = False,
        plot: bool = False, out: Path = Path("bench-results")) -> BenchResult | None:
    """`ahc bench serve` with its options (bench/registry.py): AHC and vLLM side by side, or the server at
    `base_url`; `scaling` at each number of streams, into OUT/serve-scaling.json; `plot` draws
    OUT/serve-scaling.png. None when only redrawing the plot."""
    target = target_at(base_url, model, api_key, pid, api_server_count)
    scaling_file = out / "serve-scaling.json"
    if scaling:
        result = run_scaling(load, rounds, target, api_servers=api_server_count)
        print(f"wrote {result.save(out)}", file=sys.stderr)
    elif plot:
        if not scaling_file.exists():
            raise FileNotFoundError(f"{scaling_file}: no scaling results to plot; run with --scaling")
        result = BenchResult(**json.loads(scaling_file.read_text()))
    else:
        result = run_target(target, load, rounds) if target else run_both(load, rounds, api_server_count)
    if plot:
        print(f"wrote {plot_scaling(result, out / 'serve-scaling.png')}", file=sys.stderr)
    return result if scaling or not plot else None


def target_at(base_url: str | None, model: str | None, api_key: str | None, pid: int | None,
              api_servers: int) -> Target | None:
    """The running server `base_url` names (its first model unless `model`), or None to start both."""
    if base_url is None:
        given = [flag for flag, value in (("--model", model), ("--api-key", api_key), ("--pid", pid)) if value]
        if given:
            raise BadOptions(f"{', '.join(given)} need --base-url")
        return None
    if api_servers > 1:
        raise BadOptions("--api-server-count starts both servers; a server given by --base-url runs as it is")
    base_url = base_url.rstrip("/").removesuffix("/v1")
    if model is None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        try:
            response = httpx.get(f"{base_url}/v1/models", headers=headers, timeout=30)
            response.raise_for_status()
        except httpx.HTTPError as exc:
            raise OSError(f"--base-url {base_url}: {exc}") from exc
        model = response.json()["data"][0]["id"]
    return Target(base_url, model, api_key, pid)


def run_both(prof: Profile, rounds: int | None = None, api_servers: int = 1) -> BenchResult:
    """AHC and vLLM side by side under the profile's load, each with `api_servers` API processes."""
    n_rounds, load = rounds or prof.rounds, load_of(prof)
    with side_by_side(prof, prof.max_num_seqs, api_servers) as sides:
        results = alternating_rounds([lambda s=s: s.measure(load) for s in sides], n_rounds)
    vllm, ahc = sides
    if not ahc.rows_with_activations:
        raise RuntimeError("serve bench: AHC recorded no tokens with activations; the comparison would be unfair")
    figures: dict[str, float | int] = {**side_figures(ahc, results[1]), **side_figures(vllm, results[0]),
                                       "batch": load.clients, "requests_per_client": load.requests,
                                       "max_tokens": load.max_tokens, "rounds": n_rounds}
    ratios = {"ahc_over_vllm": figures["ahc_tok_per_s"] / figures["vllm_tok_per_s"],
              "ahc_cpu_over_vllm": figures["ahc_cpu_us_per_token"] / figures["vllm_cpu_us_per_token"]}
    recorded = ("every token recorded in XDB with top-10 concept activations, drawn by the emulated engine "
                "and shipped as the capture worker ships them (activation_source 'emulated')"
                if prof.emulate else "every token recorded in XDB with top-10 concept activations "
                                     f"(lens at layer {SERVED[prof.model].lens_layer})")
    notes = {**common_notes(prof, load, n_rounds),
             "api_servers": f"{api_servers} API process(es) on each side (--api-server-count); api_cpu_*: all of "
                            "them together",
             "ahc": recorded,
             "vllm": "python -m vllm.entrypoints.openai.api_server, same engine flags",
             **side_notes(ahc, results[1]), **side_notes(vllm, results[0])}
    return BenchResult("serve", figures, ratios, notes)


def run_target(target: Target, prof: Profile, rounds: int | None = None) -> BenchResult:
    """The profile's load on a server already running; its CPU per token only with `target.pid`. An AHC
    server (its replies name their XDB session) has its recording checked too."""
    n_rounds, load = rounds or prof.rounds, load_of(prof)
    side = Side("", target)
    results = alternating_rounds([lambda: side.measure(load)], n_rounds)[0]
    figures: dict[str, float | int] = {**side_figures(side, results), "batch": load.clients,
                                       "requests_per_client": load.requests, "max_tokens": load.max_tokens,
                                       "rounds": n_rounds}
    notes = {**common_notes(prof, load, n_rounds), "model": f"{target.model}, as served at {target.base_url}",
             "device": "the server's own", **side_notes(side, results)}
    return BenchResult("serve", figures, {}, notes)


def run_scaling(prof: Profile, rounds: int | None = None, target: Target | None = None,
                streams: Sequence[int] | None = None, api_servers: int = 1) -> BenchResult:
    """Every figure of the plain run (tokens/s, each process's CPU per token and per request, the cores each
    used, latency percentiles) at each number of concurrent streams (the profile's), for AHC and vLLM (or
    the one server at `target`); figures are named `..._at_N` for N streams."""
    streams = streams or prof.scaling_streams
    n_rounds = rounds or SCALING_ROUNDS
    max_num_seqs = max(prof.max_num_seqs or 0, *streams)
    figures: dict[str, float | int] = {"max_tokens": prof.max_tokens, "requests_per_client": prof.requests,
                                       "rounds": n_rounds}
    ratios: dict[str, float] = {}

    def measure_all(sides: list[Side]) -> None:
        for n in streams:
            load = load_of(prof, n)
            results = alternating_rounds([lambda s=s, ld=load: s.measure(ld) for s in sides], n_rounds)
            for side, rs in zip(sides, results):  # every figure of the plain run, at each N
                figures.update({f"{name}_at_{n}": value for name, value in side_figures(side, rs).items()})
            if len(sides) == 2:
                ratios[f"ahc_over_vllm_at_{n}"] = figures[f"ahc_tok_per_s_at_{n}"] / figures[f"vllm_tok_per_s_at_{n}"]
                ratios[f"ahc_cpu_over_vllm_at_{n}"] = (figures[f"ahc_cpu_us_per_token_at_{n}"]
                                                       / figures[f"vllm_cpu_us_per_token_at_{n}"])

    notes = {**common_notes(prof, load_of(prof), n_rounds), "streams": ",".join(str(n) for n in streams),
             "api_servers": f"{api_servers} API process(es) on each side (--api-server-count)",
             "load": f"N streaming clients x {prof.requests} chat requests x {prof.max_tokens} tokens (ignore_eos); "
                     f"{n_rounds} measured rounds at each N after a warm-up"}
    if target is not None:
        sides = [Side("", target)]
        measure_all(sides)
        notes.update(model=f"{target.model}, as served at {target.base_url}", device="the server's own")
    else:
        with side_by_side(prof, max_num_seqs, api_servers) as sides:
            measure_all(sides)
        notes["max_num_seqs"] = str(max_num_seqs)
        if sides[1].audit:
            notes["audit_ahc"] = f"after the server stopped: {sides[1].audit}"
    return BenchResult("serve-scaling", figures, ratios, notes)


def plot_scaling(result: BenchResult, out: Path) -> Path:
    """Tokens/s and API CPU per token against concurrent streams, one line a server."""
    try:
        import matplotlib
    except ImportError as exc:
        raise ImportError("--plot needs matplotlib, which is not installed (pip install matplotlib)") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    streams = [int(n) for n in result.notes["streams"].split(",")]
    prefixes = sorted({key.split("tok_per_s_at_")[0] for key in result.figures if "tok_per_s_at_" in key})
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, name, label in ((axes[0], "tok_per_s", "completion tokens/s"),
                            (axes[1], "cpu_us_per_token", "API process CPU µs per token")):
        for prefix in prefixes:
            points = [(n, result.figures[f"{prefix}{name}_at_{n}"]) for n in streams
                      if f"{prefix}{name}_at_{n}" in result.figures]
            if points:
                ax.plot(*zip(*points), marker="o", label=prefix.rstrip("_") or "server")
        ax.set_xscale("log", base=2)
        ax.set_xticks(streams, [str(n) for n in streams])
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"ahc bench serve --scaling, profile {result.notes.get('profile', '?')}")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
