"""`ahc codex load DIR`: a directory or codebase tree as Codex documents, loaded again as its files change.

Each text file becomes an XDB document named `NAME/its/path`, at `path` its path in the tree, tagged
`codex:NAME`; a request then names the whole tree with `context.codex: [{"tag": "codex:NAME"}]`. A load
again stores a new version only of a file whose content changed, so a prompt built from the unchanged ones
stays byte-identical and its prefix cached; a file gone from the tree leaves the set (its document keeps its
versions, without the tag).

What is left out: `.git/`, whatever `.gitignore` files in the tree ignore (git's own rules, by pathspec),
`--ignore` patterns, binary files (a NUL byte, or not UTF-8) and files over the per-file limit, each said.
A tree over the size budget loads nothing: an error naming its size, so a prompt never gets half a tree.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx
import pathspec

from server.http.errors import error_message

TAG_PREFIX = "codex:"
SOURCE = "ahc codex load"
MAX_BYTES = 8 << 20  # the whole tree: what a Codex in a prompt (or its RAG index) is meant to hold
MAX_FILE_BYTES = 512 << 10


@dataclass(frozen=True)
class TreeFile:
    path: str  # relative, with '/'
    text: str
    sha256: str


@dataclass
class Scan:
    files: list[TreeFile] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, why)

    @property
    def bytes(self) -> int:
        return sum(len(f.text.encode()) for f in self.files)


def scan(root: Path, ignore: list[str], max_bytes: int = MAX_BYTES, max_file_bytes: int = MAX_FILE_BYTES) -> Scan:
    """The tree's text files, in path order; ValueError if it is not a directory or is over `max_bytes`."""
    if not root.is_dir():
        raise ValueError(f"{root} is not a directory")
    out = Scan()
    extra = pathspec.GitIgnoreSpec.from_lines(ignore)
    for path in _walk(root, root, [], extra):
        rel = path.relative_to(root).as_posix()
        size = path.stat().st_size
        if size > max_file_bytes:
            out.skipped.append((rel, f"{size:,} bytes, over the {max_file_bytes:,} a file"))
            continue
        raw = path.read_bytes()
        try:
            if b"\0" in raw[:8192]:
                raise UnicodeDecodeError("utf-8", raw, 0, 1, "a NUL byte")
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            out.skipped.append((rel, "binary"))
            continue
        out.files.append(TreeFile(rel, text, hashlib.sha256(raw).hexdigest()))
    if out.bytes > max_bytes:
        raise ValueError(f"{root} holds {out.bytes:,} bytes of text in {len(out.files)} files, over the budget of "
                         f"{max_bytes:,}: leave some out with --ignore, or raise --max-bytes")
    return out


def _walk(root: Path, here: Path, specs: list[tuple[Path, pathspec.GitIgnoreSpec]],
          extra: pathspec.GitIgnoreSpec) -> Iterator[Path]:
    """Files under `here` no .gitignore on the way (nor `extra`) ignores, sorted, symlinks not followed."""
    gitignore = here / ".gitignore"
    if gitignore.is_file():
        specs = [*specs, (here, pathspec.GitIgnoreSpec.from_lines(gitignore.read_text(errors="replace").splitlines()))]
    for entry in sorted(here.iterdir(), key=lambda p: p.name):
        if entry.name == ".git" or entry.is_symlink():
            continue
        is_dir = entry.is_dir()
        rel = entry.relative_to(root).as_posix() + ("/" if is_dir else "")
        if extra.match_file(rel) or any(spec.match_file(entry.relative_to(base).as_posix() + ("/" if is_dir else ""))
                                        for base, spec in specs):
            continue
        if is_dir:
            yield from _walk(root, entry, specs, extra)
        elif entry.is_file():
            yield entry


class Documents(Protocol):
    """Where the documents are: a running server over HTTP, or a stopped one's data dir (as one tenant)."""

    def list(self, tag: str) -> list[dict[str, Any]]: ...
    def get(self, doc_id: str) -> dict[str, Any]: ...
    def add(self, **fields: Any) -> dict[str, Any]: ...
    def update(self, doc_id: str, **fields: Any) -> dict[str, Any]: ...


@dataclass
class LoadReport:
    name: str
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    bytes: int = 0

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "tag": TAG_PREFIX + self.name, "added": len(self.added),
                "updated": len(self.updated), "unchanged": len(self.unchanged), "removed": len(self.removed),
                "skipped": [{"path": p, "why": why} for p, why in self.skipped], "bytes": self.bytes}


def load(tree: Scan, name: str, docs: Documents) -> LoadReport:
    """Bring the set `codex:NAME` to the tree: new files added, changed ones a new version, gone ones untagged."""
    tag = TAG_PREFIX + name
    stored = {d["path"]: d for d in docs.list(tag) if d["name"] == f"{name}/{d.get('path')}"}
    report = LoadReport(name, skipped=tree.skipped, bytes=tree.bytes)
    for f in tree.files:
        known = stored.pop(f.path, None)
        if known is None:
            docs.add(name=f"{name}/{f.path}", content=f.text, path=f.path, tags=[tag], source=SOURCE)
            report.added.append(f.path)
        elif known["content_hash"] != f.sha256:
            docs.update(known["id"], content=f.text, tags=known.get("tags") or [tag])
            report.updated.append(f.path)
        else:
            report.unchanged.append(f.path)
    for path, gone in sorted(stored.items()):
        docs.update(gone["id"], content=docs.get(gone["id"])["content"],
                    tags=[t for t in gone.get("tags") or [] if t != tag])
        report.removed.append(path)
    return report


@dataclass(frozen=True)
class HttpDocuments:
    """A running server's documents, under the key's tenant: `client` has its base URL and the key's header."""

    client: httpx.Client

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            reply = self.client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ValueError(f"{self.client.base_url}: {exc}") from None
        if reply.status_code != 200:
            raise ValueError(f"{method} {path}: {reply.status_code} {error_message(reply)}")
        return reply.json()

    def list(self, tag: str) -> list[dict[str, Any]]:
        return list(self._call("GET", "/v1/xdb/documents", params={"tag": tag})["data"])

    def get(self, doc_id: str) -> dict[str, Any]:
        return dict(self._call("GET", f"/v1/xdb/documents/{doc_id}"))

    def add(self, **fields: Any) -> dict[str, Any]:
        return dict(self._call("POST", "/v1/xdb/documents", json=fields))

    def update(self, doc_id: str, **fields: Any) -> dict[str, Any]:
        return dict(self._call("POST", f"/v1/xdb/documents/{doc_id}", json=fields))


@dataclass(frozen=True)
class ViewDocuments:
    """A stopped server's documents, opened from its data dir, as one tenant's (server/tenancy/tenant_xdb.py)."""

    view: Any  # TenantXDB

    def list(self, tag: str) -> list[dict[str, Any]]:
        return list(self.view.documents(tag=tag))

    def get(self, doc_id: str) -> dict[str, Any]:
        return dict(self.view.document(doc_id))

    def add(self, **fields: Any) -> dict[str, Any]:
        return dict(self.view.add_document(**fields))

    def update(self, doc_id: str, **fields: Any) -> dict[str, Any]:
        return dict(self.view.update_document(doc_id, **fields))
