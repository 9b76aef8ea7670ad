"""Where a run's history lives: `interaction_log` (its turns) and `meta_knowledge` (its knowledge
snapshots), the agent's two tables in XDB.

DuckDB allows one writing process per file and the server owns its XDB, so there are two ways in
behind one small interface: `LocalRunStore` opens an XDB of its own under the run's data directory
(the baseline policy, or any run without an AHC server), `HttpRunStore` goes through the server's
`/v1/xdb/interactions` and `/v1/xdb/meta_knowledge` routes (server/routes/agent_routes.py). A run's end-of-run
report PNG goes the same way, so a UI on the server can show it, and so does its history across runs
(progress, attempts, theorem versions: xdb/run_history.py), so a later run on the same rule reads it.
"""

from __future__ import annotations

import base64
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

import httpx

from xdb.owner import EVERY
from xdb.run_history import (
    Progress,
    record_attempt,
    record_progress,
    record_theorem_version,
    run_history,
    theorem_lineage,
)
from xdb.runs import list_interactions, log_interaction, meta_knowledge, purge_run, save_meta_knowledge

Row = dict[str, Any]


class StoreUnavailable(RuntimeError):
    """The store cannot be reached (server down, route missing); the message says which."""


class RunStore(Protocol):
    kind: str  # "local" or "http", for the report

    def log_interaction(self, run_id: str, *, journal_entry: str | None, tool_call_json: str | None,
                        tool_result_json: str | None, token_count: int | None) -> int: ...

    def interactions(self, run_id: str, *, pattern: str | None = None, last: int | None = None) -> list[Row]: ...

    def save_meta_knowledge(self, run_id: str, *, theorems_json: str | None, negative_knowledge: str | None,
                            last_compacted_turn: int | None) -> int: ...

    def meta_knowledge(self, run_id: str) -> Row | None: ...

    def purge(self, run_id: str) -> dict[str, int]: ...

    def save_report(self, run_id: str, png: bytes) -> None: ...

    # -- history across runs (xdb/run_history.py) --
    def record_progress(self, run_id: str, progress: Progress) -> int: ...

    def record_attempt(self, run_id: str, *, rule: str, turn: int, kind: str, subject: str, verdict: str,
                       law_json: str | None = None, detail: str | None = None) -> int: ...

    def record_theorem_version(self, run_id: str, *, theorem_id: str, change: str, turn: int, theorem_json: str,
                               reason: str | None = None) -> int: ...

    def theorem_lineage(self, run_id: str, theorem_id: str | None = None) -> list[Row]: ...

    def history(self, rule: str | None = None, strategy: str | None = None) -> dict[str, Any]: ...

    def close(self) -> None: ...


class LocalRunStore:
    """An XDB of the run's own (a DuckDB file under --data-dir)."""

    kind = "local"

    def __init__(self, data_dir: Path | str) -> None:
        from xdb import XDB

        self.xdb = XDB.open(data_dir)

    def log_interaction(self, run_id: str, **fields: Any) -> int:
        return self.xdb.write(log_interaction, run_id, **fields)

    def interactions(self, run_id: str, *, pattern: str | None = None, last: int | None = None) -> list[Row]:
        return self.xdb.read(list_interactions, run_id, pattern=pattern, last=last)

    def save_meta_knowledge(self, run_id: str, **fields: Any) -> int:
        return self.xdb.write(save_meta_knowledge, run_id, **fields)

    def meta_knowledge(self, run_id: str) -> Row | None:
        rows = self.xdb.read(meta_knowledge, run_id)
        return rows[0] if rows else None

    def purge(self, run_id: str) -> dict[str, int]:
        return self.xdb.write(purge_run, run_id)

    def save_report(self, run_id: str, png: bytes) -> None:
        self.xdb.save_run_report(run_id, png, EVERY)

    def record_progress(self, run_id: str, progress: Progress) -> int:
        return self.xdb.write(record_progress, run_id, progress)

    def record_attempt(self, run_id: str, **fields: Any) -> int:
        return self.xdb.write(record_attempt, run_id, **fields)

    def record_theorem_version(self, run_id: str, **fields: Any) -> int:
        return self.xdb.write(record_theorem_version, run_id, **fields)

    def theorem_lineage(self, run_id: str, theorem_id: str | None = None) -> list[Row]:
        return self.xdb.read(theorem_lineage, run_id, theorem_id)

    def history(self, rule: str | None = None, strategy: str | None = None) -> dict[str, Any]:
        return self.xdb.read(run_history, EVERY, rule, strategy)

    def close(self) -> None:
        self.xdb.close()


class HttpRunStore:
    """The server's XDB through its agent routes."""

    kind = "http"

    def __init__(self, server_root: str, api_key: str | None = None, timeout: float = 30.0,
                 client: httpx.Client | None = None) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # `client` lets tests pass an in-process one (Starlette's TestClient is an httpx.Client).
        self.http = client or httpx.Client(base_url=server_root.rstrip("/"), headers=headers, timeout=timeout)

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise StoreUnavailable(f"XDB route {path} unreachable: {exc}") from None
        if response.status_code == 404:  # our routes never answer 404: the route itself is missing
            raise StoreUnavailable(f"the server has no {path} route (not an AHC server with agent routes)")
        if response.status_code >= 400:
            error = _json_or_empty(response).get("error", {})
            raise StoreUnavailable(
                f"{method} {path}: {response.status_code} {error.get('message', response.text[:200])}")
        return response.json()

    def probe(self, run_id: str) -> None:
        """Raise StoreUnavailable unless the routes answer (an older server without the history
        routes counts as one without agent routes: the run's rows then all go to a local XDB)."""
        self._call("GET", "/v1/xdb/interactions", params={"run_id": run_id, "last": 1})
        self._call("GET", "/v1/xdb/runs/history", params={"limit": 1})

    def log_interaction(self, run_id: str, **fields: Any) -> int:
        turn_id: int = self._call("POST", "/v1/xdb/interactions", json={"run_id": run_id, **fields})["turn_id"]
        return turn_id

    def interactions(self, run_id: str, *, pattern: str | None = None, last: int | None = None) -> list[Row]:
        params = {k: v for k, v in (("run_id", run_id), ("pattern", pattern), ("last", last)) if v is not None}
        rows: list[Row] = self._call("GET", "/v1/xdb/interactions", params=params)["data"]
        return rows

    def save_meta_knowledge(self, run_id: str, **fields: Any) -> int:
        version_id: int = self._call("POST", "/v1/xdb/meta_knowledge", json={"run_id": run_id, **fields})["version_id"]
        return version_id

    def meta_knowledge(self, run_id: str) -> Row | None:
        rows = self._call("GET", "/v1/xdb/meta_knowledge", params={"run_id": run_id})["data"]
        return rows[0] if rows else None

    def purge(self, run_id: str) -> dict[str, int]:
        deleted: dict[str, int] = self._call("DELETE", f"/v1/xdb/runs/{_path_segment(run_id)}")["deleted"]
        return deleted

    def save_report(self, run_id: str, png: bytes) -> None:
        # Base64 in JSON: the server takes no body but application/json (server/http/content_type.py).
        self._call("PUT", f"/v1/xdb/runs/{_path_segment(run_id)}/report",
                   json={"png_base64": base64.b64encode(png).decode("ascii")})

    def record_progress(self, run_id: str, progress: Progress) -> int:
        body = {"run_id": run_id, **asdict(progress)}
        progress_id: int = self._call("POST", "/v1/xdb/run_progress", json=body)["progress_id"]
        return progress_id

    def record_attempt(self, run_id: str, **fields: Any) -> int:
        attempt_id: int = self._call("POST", "/v1/xdb/run_attempts", json={"run_id": run_id, **fields})["attempt_id"]
        return attempt_id

    def record_theorem_version(self, run_id: str, **fields: Any) -> int:
        version: int = self._call("POST", "/v1/xdb/theorem_versions", json={"run_id": run_id, **fields})["version"]
        return version

    def theorem_lineage(self, run_id: str, theorem_id: str | None = None) -> list[Row]:
        params = {"run_id": run_id, **({"theorem_id": theorem_id} if theorem_id else {})}
        rows: list[Row] = self._call("GET", "/v1/xdb/theorem_versions", params=params)["data"]
        return rows

    def history(self, rule: str | None = None, strategy: str | None = None) -> dict[str, Any]:
        params = {k: v for k, v in (("rule", rule), ("strategy", strategy)) if v is not None}
        found: dict[str, Any] = self._call("GET", "/v1/xdb/runs/history", params=params)
        return found

    def close(self) -> None:
        self.http.close()


def _path_segment(value: str) -> str:
    """`value` as one URL path segment. Unescaped, a `/` would add segments, `?` or `#` end the path,
    and a segment of `.` or `..` be resolved away by the client before the request is sent."""
    quoted = quote(value, safe="")
    return quoted.replace(".", "%2E") if quoted in (".", "..") else quoted


def _json_or_empty(response: httpx.Response) -> dict[str, Any]:
    try:
        data = response.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def store_for(server_root: str | None, api_key: str | None, data_dir: Path, run_id: str) -> RunStore:
    """The server's XDB when it has the agent routes, else a local XDB under `data_dir / "xdb"` (a
    plain vLLM server, or an AHC server without them). A server that is down is the caller's error
    to report; this only decides where the rows go."""
    if server_root:
        remote = HttpRunStore(server_root, api_key)
        try:
            remote.probe(run_id)
            return remote
        except StoreUnavailable:
            remote.close()
    return LocalRunStore(Path(data_dir) / "xdb")
