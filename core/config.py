"""The one typed configuration object: built-in defaults, then a YAML file (`--config`, a path or the
name of a bundled example such as `cpu-tiny`), then `AHC_*` environment variables, then command-line
flags, each overriding the one before. Flag names follow vLLM's (`--max-model-len`, `--api-key`, ...).
Unknown keys are errors, so a typo in a YAML file or an `AHC_*` variable is caught at start-up.

Environment: `AHC_<FIELD>` for a top-level field (`AHC_HOST`, `AHC_DATA_DIR`), `AHC_<SECTION>__<FIELD>` for
one in a section (`AHC_XDB__SERVICE_PROCESS=false`); the API key from `AHC_API_KEY` or vLLM's `VLLM_API_KEY`,
so it stays out of `ps`.
"""

from __future__ import annotations

import os
import shutil
from contextvars import ContextVar
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict, SettingsError


def _checkout() -> Path | None:
    """The source checkout this package runs from (an editable install), None when installed as a wheel."""
    root = Path(__file__).resolve().parents[1]
    return root if (root / "pyproject.toml").is_file() else None


CHECKOUT = _checkout()


NO_MODEL = ("no model to serve: give one as `ahc serve MODEL` (a local directory or a Hugging Face Hub id), "
            "or `model:` in the --config file")


def cache_dir() -> Path:
    """Where built models, lens packs and other rebuildable files go: `AHC_CACHE_DIR`, else the checkout's
    `.cache/`, else `~/.cache/ahc` (never inside an installed package)."""
    if os.environ.get("AHC_CACHE_DIR"):
        return Path(os.environ["AHC_CACHE_DIR"])
    return CHECKOUT / ".cache" if CHECKOUT is not None else Path.home() / ".cache" / "ahc"


def bundled_configs() -> Traversable:
    """The example configs shipped with the package (a checkout shows them in configs/)."""
    return resources.files("core").joinpath("configs")


class _Strict(BaseModel):
    # A field's docstring is its description: the configuration reference is generated from them.
    model_config = ConfigDict(extra="forbid", protected_namespaces=(), use_attribute_docstrings=True)


class EngineConfig(_Strict):
    """What vLLM's engine gets; each field maps to the vLLM flag of the same name."""

    max_model_len: int = Field(2048, gt=0)
    """The context window in tokens: vLLM's `--max-model-len`, and the window the orchestrator budgets for."""
    dtype: str = "auto"
    """The weights' and activations' data type, as vLLM's `--dtype` (auto: the model's own)."""
    enforce_eager: bool = False
    """Run the model eagerly, without CUDA graphs (vLLM's `--enforce-eager`)."""
    enable_prefix_caching: bool = True
    """vLLM's prefix cache, which every agent turn reuses; turning it off costs the whole prompt's prefill each
    turn."""
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    """The share of the GPU's memory vLLM may take for the weights and the KV cache."""
    max_num_seqs: int | None = Field(None, gt=0)
    """Sequences the engine runs at once; None: vLLM's own default for the device (on the emulated engine, the
    emulated GPU's)."""
    max_num_batched_tokens: int | None = Field(None, gt=0)
    """Tokens the scheduler batches in one step; None: vLLM's own default for the device."""
    block_size: int | None = Field(None, gt=0)
    """Tokens in one KV cache block; None: vLLM's own default for the device."""
    seed: int = 0
    """The engine's random seed (sampling, and the emulated engine's drawn tokens)."""
    tensor_parallel_size: int = Field(1, gt=0)
    """GPUs the model is split across (vLLM's `--tensor-parallel-size`)."""
    tool_call_parser: str | None = "hermes"
    """vLLM's tool call parser for the served model's format; None: no tool calls parsed."""
    tool_strict_level: Literal["auto", "function", "parameter"] = "parameter"
    """How far tool calls are held to their tools' schemas by the grammar. vLLM's own default ("auto") pins
    arguments only for tools marked `strict`, and a small model then answers a `{city}` schema with a bare
    string; "parameter" pins every tool's arguments, as OpenAI's strict mode does."""
    cpu_kvcache_space_gib: int = Field(1, gt=0)
    """vLLM's CPU build sizes its KV cache from this (GiB); ignored on a GPU."""
    shutdown_timeout: int = Field(10, ge=0)
    """Seconds SIGTERM waits for in-flight requests before aborting them."""
    kv_offloading_size: float | None = Field(None, gt=0)
    """KV offloading to CPU memory (GiB, over all ranks; None: off) through vLLM's connector: prefixes evicted
    from the GPU are restored by a copy instead of a prefill. Needs a GPU build ("native": vLLM's own CPU tier;
    "lmcache": an LMCache server, whose own capacity this should state)."""
    kv_offloading_backend: Literal["native", "lmcache"] = "native"
    """The CPU tier's implementation: `native` (vLLM's own) or `lmcache` (an LMCache server)."""
    session_priority: bool = True
    """Each request's priority is its session's place in line (the one its first call drew), and the engine
    schedules by it (vLLM's `--scheduling-policy priority`): a session that has started finishes before new ones
    crowd it out. A request with a `priority` of its own keeps it."""
    # Which KV tiers evict the idle session expected back latest first, its return predicted from the
    # gaps sessions leave between calls, rather than the least recently used: "cpu" (the CPU tier's
    # eviction policy, with kv_offloading_size and the native backend), "gpu" (the scheduler orders the
    # GPU's free blocks), "both" or "off". Advisory: a wrong prediction only changes which block goes first.
    # The GPU's order is off by default: on the agents bench it cost more hits than it kept.
    return_order: Literal["off", "cpu", "gpu", "both"] = "cpu"
    """Which KV tiers evict the idle session expected back latest first, its return predicted from the gaps
    sessions leave between calls, rather than the least recently used: `cpu` (the CPU tier's eviction policy,
    with kv_offloading_size and the native backend), `gpu` (the scheduler orders the GPU's free blocks), `both`
    or `off`. Advisory: a wrong prediction only changes which block goes first. The GPU's order is off by
    default: on the agents bench it cost more hits than it kept."""
    extra_args: list[str] = Field(default_factory=list)
    """Any other vLLM flag, passed through verbatim (e.g. ["--quantization", "awq"])."""
    emulate: str | None = None
    """An emulated GPU instead of this machine's device (e.g. "h100-llama-8b", server/emulation/): vLLM's
    scheduler and KV cache manager run as they are, each step takes as long as the named GPU would take for the
    named model, and reply tokens are drawn, not generated. The model's tokenizer and chat template are used, its
    weights never read. Shown in /v1/models and the logs."""
    emulate_reply_tokens: int | None = Field(None, ge=1)
    """With `emulate`: each reply ends with the model's end-of-sequence token after a length drawn around this
    many tokens (exponentially, by the request), so agent clients finish their turns as they do on a model; None:
    a reply runs to its max_tokens (what the serving benchmarks measure)."""

    @model_validator(mode="after")
    def _reply_tokens_when_emulated(self) -> EngineConfig:
        if self.emulate_reply_tokens is not None and self.emulate is None:
            raise ValueError("engine.emulate_reply_tokens needs engine.emulate (an emulated GPU)")
        return self


class OrchestratorConfig(_Strict):
    """How the orchestrator assembles and governs the prompt of a request that carries `context`."""

    cag_threshold: float = Field(0.7, gt=0, le=1)
    """auto mode injects the whole Codex (CAG) while the prompt is under this share of the window; a request's
    `context.cag_threshold` overrides it for that request."""
    formatter: str = "default"
    """How the prompt's blocks are laid out as chat messages: `default` (Markdown), `xml`, or a plug-in of the
    `ahc.formatters` entry point group; a request's `context.formatter` overrides it."""
    injectors: list[str] = Field(default_factory=list)
    """Artifact injectors to run, in order, on every request that carries `context`: plug-ins of the
    `ahc.injectors` entry point group adding Codex documents or Karma entries after the request's own (none by
    default)."""
    karma_staging: bool = True
    """A karma entry added mid-session rides in State (append-only) until the next compaction instead of
    rewriting the Karma block, which would re-prefill the whole State behind it (orchestrator/karma.py)."""
    codex_condense: bool = True
    """Prompt density: when the prompt needs room before auto mode would leave the Codex out for RAG, a Codex
    document (not verbatim) is sent as its condensed rendition: made once by the served model (at most
    codex_condense_ratio of its tokens), stored in XDB as a document keyed by the source's SHA-256 and the model.
    False: never made (renditions a client sends inline are still used)."""
    codex_condense_ratio: float = Field(0.3, gt=0, lt=1)
    """A condensed rendition's length at most, as a share of its source document's tokens."""
    codex_condense_windows_per_hour: float = Field(16.0, gt=0)
    """What the server's background model calls may cost each tenant: prompt and completion tokens of its Codex
    renditions, Identity condensations and Karma reviews by the model over a rolling hour, in whole windows
    (16 x an 8k window: 131k tokens an hour); past it such a call is a 429 (`hidden_call_budget`)."""
    identity_condense_ratio: float = Field(0.5, gt=0, lt=1)
    """`POST /v1/context/identity/condense`: the condensed persona's length at most, as a share of the Identity's
    tokens (the bound on the served model's reply)."""
    identity_condense_max_tokens: int = Field(4096, gt=0)
    """The largest Identity `POST /v1/context/identity/condense` takes, in tokens (a larger one is refused, 413):
    the Identity, the traces and the condensed reply must fit one call's window."""
    identity_test_max_tokens: int = Field(128, gt=0, le=4096)
    """Each test answer's bound in tokens when `POST /v1/context/identity/condense` checks a condensation: both
    the full and the condensed Identity answer every test in at most this many."""
    rag_top_k: int = Field(4, gt=0, le=32)
    """Excerpts retrieved into the Query block per RAG request."""
    rag_max_documents: int = Field(1000, gt=0)
    """Codex documents one request may carry."""
    rag_max_document_chars: int = Field(2_000_000, gt=0)
    """Characters of one Codex document, at most."""
    rag_max_total_chars: int = Field(20_000_000, gt=0)
    """Characters of a request's whole Codex, at most."""
    max_chars: int | None = Field(None, ge=0)
    """CTC governor: a cap on the assembled prompt's characters (max_turns caps its State's turns), a safety net
    behind compaction. None (unset): derived from max_model_len, above what compaction keeps
    (orchestrator/ctc_governor.py): 90% of the window at 4 characters a token (7,373 at 2,048; 117,965 at 32k).
    0 turns the cap off."""
    max_turns: int | None = Field(None, ge=0)
    """Cap on the State's turns (a user message and what follows it); None: 512; 0: no cap."""
    compaction_threshold: float = Field(0.5, gt=0, le=1)
    """Past this share of max_model_len in State tokens, the oldest turns are summarised by the served model (the
    threshold follows the window: 1,024 tokens at 2,048, 16k at 32k); compaction_threshold_tokens sets it in
    tokens instead."""
    compaction_threshold_tokens: int | None = Field(None, gt=0)
    """State tokens past which the oldest turns are summarised, instead of compaction_threshold's share of the
    window."""
    compaction_keep_turns: int = Field(4, ge=0)
    """The most recent turns (a user message and what follows it) a compaction keeps as they are (within
    compaction_keep_share)."""
    compaction_keep_share: float = Field(0.125, ge=0, le=1)
    """The kept turns take at most this share of the State's room in the window: every compaction re-prefills
    the turns it keeps (the summary before them changed), and the more it keeps, the sooner the next one comes.
    An agent's turn with long tool results may be kept as none."""
    compaction_max_tokens: int = Field(128, gt=0)
    """Tokens a compaction's summary may take."""
    default_completion_tokens: int = Field(512, gt=0)
    """The prompt budget is max_model_len minus the request's completion budget (max_tokens or
    max_completion_tokens). A request that names none still gets this much room for its reply: the prompt is
    kept under max_model_len minus this (at most half the window)."""
    vram_queue_timeout_s: float = Field(30.0, ge=0)
    """VRAM governor: how long a request may wait for KV blocks before State is compacted / 429. Turns short of
    blocks wait for running ones to finish, as in vLLM's own queue; a 429 would make the client wait its whole
    Retry-After instead."""
    recording_wait_s: float = Field(2.0, ge=0)
    """How long a new generation waits while XDB's recording backlog is over its bound, before a 503."""
    session_admission: bool = True
    """Session-aware admission. A session is in flight while a turn of it runs or it is within its own usual
    think time (at most session_hot_s). When re-prefilling every session in flight would take the engine longer
    than that think time (session_wait_per_prefill seconds of wait per second of the engine's measured prefill),
    the cache goes to sessions in their order in line: a turn waits until its context fits beside those ahead of
    it. Otherwise a cold turn that would evict a session about to come back waits only while that costs less than
    the prefill it spares. No wait passes session_max_wait_s, and a session not yet in flight (new, or back from
    quiet) waits at most session_first_wait_s before it goes in past the cap: none is starved. With a CPU tier
    (engine.kv_offloading_size) a miss the tier serves is priced at its load, and the sessions in flight are
    capped to what the two tiers hold together. False: first come, first served."""
    session_hot_s: float = Field(10.0, ge=0)
    """A session counts as in flight within its own usual gap between calls, at most this many seconds."""
    session_max_wait_s: float = Field(300.0, ge=0)
    """No turn waits longer than this for session-aware admission."""
    session_first_wait_s: float = Field(10.0, ge=0)
    """A session entering flight (new, or back from quiet) waits at most this long, then goes in past the cap."""
    session_wait_per_prefill: float = Field(1.0, ge=0)
    """Seconds of waiting one second of the engine's measured prefill is worth."""
    retry_after_s: int = Field(2, gt=0)
    """The `Retry-After` (seconds) of a 429 or 503 the server answers when it cannot take a request now."""
    max_sessions: int = Field(10_000, gt=0)
    """Sessions kept in memory; past this the least recently used idle ones are dropped and reloaded from XDB
    when they return."""
    cache_max_chars: int = Field(64 << 20, gt=0)
    """Characters of text the token-count cache may hold, and each of the render cache's two memos: their keys
    are whole blocks, and a Codex may be 20 MB. Keep it above rag_max_total_chars, or a Codex that long is
    tokenized again on every request."""
    rag_max_index_files: int = Field(256, gt=0)
    """Per-session RAG index files kept under data_dir/rag; past this the least recently used idle ones are
    deleted (an index is rebuilt from the Codex its session sends with every RAG request)."""

    def compaction_tokens(self, max_model_len: int) -> int:
        """State tokens past which a session is compacted."""
        return self.compaction_threshold_tokens or max(int(self.compaction_threshold * max_model_len), 1)

    def completion_reserve(self, max_model_len: int, requested: int | None) -> int:
        """Tokens kept free for the reply: what the request asks for, else the default (at most half
        the window, so a small window still has room for a prompt)."""
        if requested is not None:
            return requested
        return min(self.default_completion_tokens, max_model_len // 2)


class RetentionConfig(_Strict):
    """How long experience is kept as it was recorded (null: no limit)."""

    verbatim_days: float | None = Field(default=30.0, gt=0)
    """Token rows older than this are compressed into per-reply records (activations and tags kept)."""
    delete_after_days: float | None = Field(default=365.0, gt=0)
    """A session idle this long is deleted, all of it, unless a window of it is pinned or SUBMITTED."""


class LakeConfig(_Strict):
    """`xdb.backend: ducklake`: the shared DuckLake every replica ships its committed rows to (catalog in
    PostgreSQL, data as Parquet files under a directory all replicas reach)."""

    catalog: str | None = None
    """The libpq connection string of the catalog's PostgreSQL database, e.g. "dbname=ahc host=127.0.0.1
    port=5433 user=ahc"."""
    data_path: str | None = None
    """The shared directory the lake's Parquet files go to."""
    replica_id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    """Names this replica (its writer) in the lake: every row it ships carries it. Unique per data dir."""
    ship_interval_s: float = Field(default=0.5, gt=0)
    """Rows committed locally reach the lake within this (a session State save ships at once)."""
    ship_batch_rows: int = Field(default=100_000, gt=0)
    """At most this many rows of one table per lake transaction; a backlog goes in several."""
    tombstone_poll_s: float = Field(default=2.0, gt=0)
    """Another replica's deletion of a session reaches this replica's own copies within this."""
    accept_emulated: bool = False
    """An emulated engine's rows (drawn tokens, modelled timings) go into a shared lake only when asked."""


class XDBConfig(_Strict):
    """The experience database: its storage quotas and its writer's batching (xdb.XDB.open takes it)."""

    # Defaults go by name (`default=`): mypy without pydantic's plugin reads a positional one as no
    # default at all, and xdb/, which builds XDBConfig(), is type-checked.

    quota_bytes: int | None = Field(default=None, gt=0)
    """Over this many bytes (the experience recorded and the audit log) the oldest cold records are compressed.
    None: `disk_quota_share` of the data dir's disk, sized when the server starts."""
    disk_quota_share: float = Field(default=0.5, gt=0, le=1)
    """With no quota_bytes: the share of the data dir's disk that is the quota."""
    keep_forever: bool = False
    """Keep everything verbatim, forever: no retention and no quota (neither may then be set)."""
    compress_at: float = Field(default=0.8, gt=0, le=1)
    """Compression starts once usage passes this share of quota_bytes, and brings it back under it, so a burst of
    writes finds room before the quota itself is reached."""
    retention: RetentionConfig = Field(default_factory=RetentionConfig)
    quota_check_s: float = Field(default=60.0, gt=0)
    """Seconds between storage passes (quota, compression, retention, sealing)."""
    erase_within_s: float | None = Field(default=3600.0, gt=0)
    """A deleted session's text leaves every file under the data dir within this: the storage pass erases (seals
    the hot timesteps, rewrites the segments holding the session's, vacuums experience.duckdb) once a deletion
    waits, at most every quarter of it. None: only on request (POST /v1/xdb/compact with vacuum)."""
    segment_rows: int = Field(default=1_000_000, gt=0)
    """The storage pass seals the hot timesteps into a segment file once they are this many rows."""
    vacuum_max_bytes: int | None = Field(default=2 << 30, gt=0)
    """A live vacuum holds recording while it copies experience.duckdb (~55 MB/s measured on 2 cores), which
    holds the unsealed timesteps and the small tables: past this size it is refused, and `ahc xdb vacuum` runs it
    with the server stopped. None: no bound."""
    summary_max_tokens: int = Field(default=96, gt=0)
    """Tokens of the summary a compressed record keeps."""
    warm_quota_bytes: int | None = Field(default=None, gt=0)
    """Bytes pinned windows may hold at full detail; None: half of quota_bytes (no cap without a quota)."""
    hot_seconds: float = Field(default=3600.0, ge=0)
    """Rows younger than this stay HOT: never compressed, whatever the quota."""
    max_document_bytes: int = Field(default=1 << 20, gt=0)
    """Bytes of one uploaded Codex document, at most."""
    export_ttl_s: float = Field(default=86_400.0, gt=0)
    """Exports (POST /v1/xdb/exports) are deleted this long after they were made, or sooner, oldest first, when
    their bytes and the recorded rows' pass quota_bytes; each tenant holds at most max_exports_per_tenant at a
    time and makes one at a time."""
    max_exports_per_tenant: int = Field(default=4, gt=0)
    """Exports a tenant may hold at once (a 429 past it)."""
    batch_rows: int = Field(default=8192, gt=0)
    """The writer commits a batch at batch_rows, or max_latency_s after its oldest row arrived. A reply's end
    waits for the batch in flight as well as its own, so batch_rows bounds that wait. On the service alone, with
    128 streams' rows arriving (~30k a second), a batch a second made the wait ~210 ms and 8192-row batches ~110
    ms, for ~2 µs more of the service's CPU a row."""
    max_latency_s: float = Field(default=1.0, gt=0)
    """A batch is committed this long after its oldest row arrived at the latest."""
    max_queue_rows: int = Field(default=1_000_000, gt=0)
    """Past max_queue_rows queued, submit blocks up to submit_timeout_s, then raises WriterBackpressure."""
    submit_timeout_s: float = Field(default=30.0, gt=0)
    """How long a submit blocks on a full queue before the writer refuses it."""
    on_disk_full: Literal["pause", "spill"] = "pause"
    """What recording does while the disk under the data dir is full or failing (xdb/service/remote.py). `pause`: every
    row is held in memory and, past max_queue_rows, new requests get 503 until the disk mends. `spill`: the rows
    go to append-only files in spill_dir (0600: tenants' text), the server keeps serving, and they are sent to
    XDB in order once it commits again (or at the next start); if spill_dir fails too, recording pauses.
    spill_dir must not lie inside the data dir; another disk."""
    spill_dir: str | None = None
    """With on_disk_full `spill`: where rows wait while the data dir's disk fails (outside the data dir, best on
    another disk)."""
    threads: int | None = Field(default=None, gt=0)
    """DuckDB threads for the experience file; None: a quarter of the cores, at least one."""
    max_tick_sessions: int = Field(default=10_000, gt=0)
    """Sessions whose next tick is kept in memory; a dropped one reads its last tick from the file again."""
    tag_cache_size: int = Field(default=4096, gt=0)
    """Tags whose names and target types recalls keep in memory; the least recently used leave, and a tag
    not among them is read from the file again."""
    recall_deadline_s: float | None = Field(default=0.5, gt=0)
    """A recall answers within this many seconds: one that reaches it returns the rows found so far, oldest
    first, marked `partial` with a cursor to continue from. None: no deadline."""
    bud_min_examples: int = Field(default=20, gt=0)
    """The examples (tag applications) a bud needs before it may be marked ready, and its evidence submitted
    for a lens to learn; its lens training file (GET /v1/xdb/buds/{tag}/examples) needs as many example texts."""
    service_process: bool = True
    """`ahc serve` runs the database, its writer and the audit chain in a process of their own, so their CPU and
    their threads' hold on the GIL stay out of the process that streams tokens; a service that dies is started
    again and sent the rows it had not committed. False: all in one process."""
    backend: Literal["duckdb", "ducklake"] = "duckdb"
    """`duckdb`: the data dir's files only. `ducklake`: those files as each replica's local buffer, and what they
    commit shipped to the shared DuckLake in `lake` (xdb/lake/lake.py)."""
    lake: LakeConfig = Field(default_factory=LakeConfig)
    """The shared experience lake, with `backend: ducklake`."""
    backup_every_s: float | None = Field(default=None, gt=0)
    """Scheduled backups (server/recording/backup_loop.py): every backup_every_s the server writes a backup,
    verifies its audit chain, and keeps the newest backup_keep. None: on demand only (SIGUSR1, `ahc xdb backup`).
    A deleted session is removed from the backups kept in backup_dir too (xdb/storage/backups.py)."""
    backup_dir: str | None = None
    """Where scheduled backups go, meant to be another disk; None: DATA_DIR/backups."""
    backup_keep: int = Field(default=3, gt=0)
    """Scheduled backups kept; older ones are deleted (SIGUSR1's are left alone)."""

    @model_validator(mode="after")
    def _forever_alone(self) -> XDBConfig:
        if self.keep_forever:
            # A value other than the default (or null) was given on purpose, and contradicts it.
            named = ["xdb.quota_bytes"] if self.quota_bytes is not None else []
            named += [f"xdb.retention.{name}" for name, field in RetentionConfig.model_fields.items()
                      if getattr(self.retention, name) not in (None, field.default)]
            if named:
                raise ValueError(f"xdb.keep_forever keeps everything: drop {', '.join(named)}")
            self.retention = RetentionConfig(verbatim_days=None, delete_after_days=None)
        return self

    @model_validator(mode="after")
    def _spill_dir_when_spilling(self) -> XDBConfig:
        if self.on_disk_full == "spill" and not self.spill_dir:
            raise ValueError("xdb.on_disk_full spill needs xdb.spill_dir (AHC_XDB__SPILL_DIR=...): a directory "
                             "outside the data dir, on another disk, where rows wait while the data dir's is full")
        if self.on_disk_full == "spill" and not self.service_process:
            raise ValueError("xdb.on_disk_full spill is done by the XDB service's client: it needs "
                             "xdb.service_process: true")
        return self

    def sized_quota(self, data_dir: Path) -> int | None:
        """The byte quota: the configured one, or `disk_quota_share` of the disk under `data_dir` (None
        with keep_forever)."""
        if self.keep_forever or self.quota_bytes is not None:
            return self.quota_bytes
        while not data_dir.exists():  # the server makes it on start: size the disk it will be on
            data_dir = data_dir.parent
        return int(shutil.disk_usage(data_dir).total * self.disk_quota_share)

    @model_validator(mode="after")
    def _lake_when_ducklake(self) -> XDBConfig:
        if self.backend == "ducklake":
            missing = [f"xdb.lake.{name}" for name in ("replica_id", "catalog", "data_path")
                       if not getattr(self.lake, name)]
            if missing:
                raise ValueError(f"xdb.backend ducklake needs {', '.join(missing)} (AHC_XDB__LAKE__"
                                 f"{missing[0].rsplit('.', 1)[1].upper()}=...): the replica's name in the lake, "
                                 "the catalog's PostgreSQL connection string and the shared data directory")
        return self


class LensConfig(_Strict):
    """In-engine concept activations: a lens pack applied to every generated token's hidden
    state inside vLLM's worker; the top-k go to XDB with the token."""

    enabled: bool = False
    """Apply the lens pack to every generated token inside vLLM's worker."""
    pack: str | None = None
    """Lens pack directory (`ahc lens train`); its model fingerprint must match the served model."""
    k: int = Field(10, ge=1, le=10)
    """Concepts kept per token; XDB stores at most 10 (xdb.schema.TOP_K)."""
    finish_wait_s: float = Field(1.0, ge=0, le=10)
    """How long the XDB writer waits for a token's activations still in flight before writing the token without
    them (normally they arrive first; a reply's last tokens may wait a little)."""
    source: Literal["auto", "hidden_state", "logit_lens"] = "auto"
    """What is measured: the hidden state at the pack's layer, or the logit lens over the pack's token sets;
    `auto` takes the hidden state where the model exposes it, else falls back to the logit lens."""
    hidden: list[str] = Field(default_factory=list)
    """Concepts of the pack (by id) measured for the audit log alone: the agent never sees them (not in its
    experience file, recall, the stream, the concepts list, exports or the lake); an auditor reads them in
    `/v1/audit/records` and `ahc xdb audit-records`. Each must be a concept of the pack (checked at start)."""
    audit_k: int = Field(10, ge=1, le=10)
    """Hidden concepts kept per token in the audit log (the top `audit_k` of `hidden`); `k` counts the others."""
    steering_hook: str | None = Field(None, min_length=1)
    """A steering hook (the name of an installed entry point of group `ahc.steering`), called after each reply
    with its tokens' concept activations; each directive it answers is recorded as a `steering` timestep
    with its rationale (recorded, not applied to the model). None: no hook."""

    @model_validator(mode="after")
    def _pack_when_enabled(self) -> LensConfig:
        if self.enabled and not self.pack:
            raise ValueError("lens.enabled needs lens.pack (a lens pack directory)")
        return self


# Off while a loaded config is copied with overrides: the environment was read once, at load, and must not
# undo a command-line flag given after it.
_READ_ENVIRONMENT: ContextVar[bool] = ContextVar("_READ_ENVIRONMENT", default=True)


class _VllmApiKey(PydanticBaseSettingsSource):
    """vLLM's `VLLM_API_KEY`, so a `vllm serve` environment works unchanged (AHC_API_KEY wins)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        key = os.environ.get("VLLM_API_KEY")
        return {"api_key": key} if key else {}


class AHCConfig(BaseSettings):
    model_config = SettingsConfigDict(extra="forbid", protected_namespaces=(), env_prefix="AHC_",
                                      env_nested_delimiter="__", case_sensitive=False,
                                      use_attribute_docstrings=True)

    model: str | None = None
    """A local directory or a Hugging Face Hub id, as vLLM takes it; `ahc serve MODEL` sets it."""
    served_model_name: str | None = None
    """The model's name in the API (`model` in requests, /v1/models); None: the model as given."""
    host: str = "127.0.0.1"
    """The address the server binds to; 0.0.0.0 opens it to the network (set an API key first)."""
    port: int = Field(8000, ge=0, le=65535)
    """The port the server listens on."""
    api_key: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Each key is a tenant (a string is one key). A keys file adds named tenants, `tenant:key` a line."""
    api_keys_file: str | None = None
    """A file of named tenants' keys, `tenant:key` a line (and `auditor NAME:KEY` for an auditor's key)."""
    max_request_bytes: int = Field(32 << 20, gt=0)
    """Request bodies over this many bytes are refused with 413 before they are parsed
    (server/http/body_limit.py); the largest legitimate body is a Codex at orchestrator.rag_max_total_chars plus
    the messages."""
    data_dir: str = ".cache/xdb"
    """Where XDB keeps its files: the experience database, the audit log, session State, RAG indexes, backups."""
    log_level: str = "info"
    """The log level of AHC's and vLLM's loggers (debug, info, warning, error)."""
    engine: EngineConfig = Field(default_factory=EngineConfig)
    orchestrator: OrchestratorConfig = Field(default_factory=OrchestratorConfig)
    xdb: XDBConfig = Field(default_factory=XDBConfig)
    lens: LensConfig = Field(default_factory=LensConfig)

    @model_validator(mode="after")
    def _no_emulated_rows_in_a_shared_lake(self) -> AHCConfig:
        if self.engine.emulate is not None and self.xdb.backend == "ducklake" and not self.xdb.lake.accept_emulated:
            raise ValueError("an emulated engine's rows would go into the shared lake beside real ones: set "
                             "xdb.lake.accept_emulated (AHC_XDB__LAKE__ACCEPT_EMULATED=true) to ship them anyway")
        return self

    @property
    def engine_label(self) -> str | None:
        """What every figure and row of an emulated engine is marked with ("emulated:PROFILE"); None on a
        real engine."""
        return None if self.engine.emulate is None else f"emulated:{self.engine.emulate}"

    @field_validator("api_key", mode="before")
    @classmethod
    def _one_or_more_keys(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else [] if value is None else value

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource,
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The environment overrides the YAML file (given as init values); the command line comes last.
        if not _READ_ENVIRONMENT.get():
            return (init_settings,)
        return env_settings, _VllmApiKey(settings_cls), init_settings

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model or ""

    def with_overrides(self, **overrides: Any) -> AHCConfig:
        """A copy with the non-None overrides applied; dotted keys reach into sections."""
        data = self.model_dump()
        for key, value in overrides.items():
            if value is None:
                continue
            target = data
            *parents, leaf = key.split(".")
            for part in parents:
                target = target[part]
            target[leaf] = value
        token = _READ_ENVIRONMENT.set(False)
        try:
            return AHCConfig.model_validate(data)
        finally:
            _READ_ENVIRONMENT.reset(token)


def load_config(path: str | Path | None = None) -> AHCConfig:
    """The built-in defaults, a YAML file or bundled example over them (None: none), and the `AHC_*`
    environment over that; raises ValueError naming the file or variable and the bad field."""
    source = _config_file(path) if path is not None else None
    data: Any = {}
    if source is not None:
        try:
            data = yaml.safe_load(source.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ValueError(f"config {path} is not valid YAML: {exc}") from exc
        if not isinstance(data, dict):
            raise ValueError(f"config {path} must be a mapping at the top level")
    where = f"config {path}" if source is not None else "config"
    try:
        return AHCConfig(**data)
    except SettingsError as exc:  # an AHC_* variable that is not valid JSON where a list or mapping is due
        raise ValueError(f"environment: {exc}") from exc
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"{where} (or its AHC_* environment): {field}: {first['msg']}") from exc


def _config_file(path: str | Path) -> Path | Traversable:
    if Path(path).is_file():
        return Path(path)
    name = str(path).removesuffix(".yaml")
    bundled = bundled_configs().joinpath(f"{name}.yaml")
    if "/" not in name and bundled.is_file():
        return bundled
    names = sorted(e.name.removesuffix(".yaml") for e in bundled_configs().iterdir() if e.name.endswith(".yaml"))
    raise ValueError(f"config file not found: {path} (bundled examples: {', '.join(names)})")


def resolve_path(path: str) -> str:
    """Relative model and data paths are taken from the working directory, then the checkout (if any)."""
    candidate = Path(path).expanduser()
    if candidate.is_absolute() or candidate.exists() or CHECKOUT is None:
        return str(candidate)
    in_repo = CHECKOUT / candidate
    return str(in_repo) if in_repo.exists() else str(candidate)
