"""`ahc codex load DIR`: a tree's text files as Codex documents tagged `codex:NAME`, what .gitignore, --ignore,
binaries and the per-file limit leave out said, a tree over the budget refused whole; loaded again, only
changed files get a new version and gone ones leave the set; a request names the tree by its tag, and an
unchanged tree keeps the prompt's prefix."""

from __future__ import annotations

import json
from pathlib import Path

from cli_runner import ahc
from fake_app import serving

from core.config import AHCConfig
from server.codex.codex_loader import HttpDocuments, load, scan
from xdb import XDB
from xdb.documents import list_documents


def tree(root: Path) -> Path:
    files = {"src/a.py": "def a():\n    return 1\n", "src/b.md": "# B\nThe rule: A moves right.\n",
             ".gitignore": "build/\n*.log\n", "build/out.py": "generated\n", "run.log": "noise\n",
             "big.txt": "x" * 500, ".git/config": "[core]\n", "src/.gitignore": "secret.txt\n",
             "src/secret.txt": "hidden\n", "tmp/scratch.py": "scratch\n"}
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "src" / "logo.png").write_bytes(b"\x89PNG\x00\x00binary")
    return root


def loaded(data_dir: Path) -> dict[str, tuple[int, list[str]]]:
    with XDB.open(data_dir) as xdb:
        return {d["name"]: (d["version"], d["tags"]) for d in xdb.read(list_documents, owner="")}


def test_a_tree_loads_leaves_out_what_it_should_and_loads_again_by_change(tmp_path: Path) -> None:
    root, data = tree(tmp_path / "proj"), tmp_path / "xdb"
    args = ["codex", "load", str(root), "--data-dir", str(data), "--max-file-bytes", "100", "--ignore", "tmp/"]
    result = ahc(*args, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert (report["tag"], report["added"], report["updated"], report["removed"]) == ("codex:proj", 4, 0, 0)
    assert {s["path"]: s["why"] for s in report["skipped"]} == {"big.txt": "500 bytes, over the 100 a file",
                                                               "src/logo.png": "binary"}
    assert loaded(data) == {f"proj/{p}": (1, ["codex:proj"]) for p in (".gitignore", "src/.gitignore", "src/a.py",
                                                                       "src/b.md")}

    (root / "src" / "a.py").write_text("def a():\n    return 2\n")
    (root / "src" / "b.md").unlink()
    (root / "src" / "c.py").write_text("C = 3\n")
    result = ahc(*args)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("codex proj (tag codex:proj): 1 added, 1 updated, 2 unchanged, 1 removed;")
    assert "left out big.txt: 500 bytes, over the 100 a file" in result.stdout
    now = loaded(data)
    assert now["proj/src/a.py"] == (2, ["codex:proj"]) and now["proj/src/c.py"] == (1, ["codex:proj"])
    assert now["proj/src/b.md"] == (2, []) and now["proj/.gitignore"] == (1, ["codex:proj"])  # left the set


def test_a_tree_over_the_budget_loads_nothing(tmp_path: Path) -> None:
    root, data = tree(tmp_path / "proj"), tmp_path / "xdb"
    result = ahc("codex", "load", str(root), "--data-dir", str(data), "--max-bytes", "20")
    assert result.returncode == 1 and result.stderr.strip().count("\n") == 0
    assert "over the budget of 20" in result.stderr
    assert not data.exists() or loaded(data) == {}
    result = ahc("codex", "load", str(root / "nope"), "--data-dir", str(data))
    assert result.returncode == 1 and "is not a directory" in result.stderr
    result = ahc("codex", "load", str(root), "--tenant", "alice")
    assert result.returncode == 1 and "--tenant needs --data-dir" in result.stderr


def test_a_request_names_the_tree_by_its_tag(config: AHCConfig, vllm_config, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    root = tree(tmp_path / "proj")
    with serving(config, vllm_config, tmp_path) as (client, _):
        report = load(scan(root, ["tmp/"], max_file_bytes=100), "proj", HttpDocuments(client))
        assert len(report.added) == 4
        tagged = client.get("/v1/xdb/documents", params={"tag": "codex:proj"}).json()["data"]
        assert sorted(d["path"] for d in tagged) == [".gitignore", "src/.gitignore", "src/a.py", "src/b.md"]
        assert client.get("/v1/xdb/documents", params={"tag": "codex:other"}).json()["data"] == []
        ask = {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "What moves?"}],
               "context": {"session_id": "s", "identity": "You read code.", "codex": [{"tag": "codex:proj"}]}}
        first = client.post("/v1/chat/completions", json=ask)
        assert first.status_code == 200, first.text
        entries = [e["id"] for e in first.json()["context"]["codex"]]
        assert entries == ["proj/.gitignore", "proj/src/.gitignore", "proj/src/a.py", "proj/src/b.md"]  # by path
        again = load(scan(root, ["tmp/"], max_file_bytes=100), "proj", HttpDocuments(client))
        assert len(again.unchanged) == 4 and not again.added + again.updated
        second = client.post("/v1/chat/completions", json={**ask, "messages": [{"role": "user", "content": "And?"}]})
        assert second.status_code == 200
        assert second.json()["context"]["first_changed_block"] not in ("identity", "codex")  # the prefix held
        missing = client.post("/v1/chat/completions", json={**ask, "context": {**ask["context"],
                                                                               "codex": [{"tag": "codex:nope"}]}})
        assert missing.status_code == 400 and "no document carries the tag 'codex:nope'" in missing.text
