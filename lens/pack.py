"""The lens pack: load, save, validate, project."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "ahc-lens/1"
WEIGHTS_FILE = "lens.safetensors"
META_FILE = "lens.json"
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}$")


def _config_dims(config: dict) -> tuple[int, int]:
    """(hidden_size, num_hidden_layers) of a HF config, looking into `text_config` for
    multimodal wrappers."""
    for source in (config, config.get("text_config") or {}):
        hidden, layers = source.get("hidden_size"), source.get("num_hidden_layers")
        if isinstance(hidden, int) and isinstance(layers, int):
            return hidden, layers
    raise ValueError("config.json: no integer 'hidden_size' and 'num_hidden_layers'")


def model_fingerprint(model_dir: str | Path) -> dict[str, Any]:
    """What a pack records about the model it was trained for: hidden size, layer count and the
    SHA-256 of config.json's bytes."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no config.json in model directory {model_dir}")
    raw = path.read_bytes()
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc.msg})") from None
    hidden, layers = _config_dims(config)
    return {"hidden_size": hidden, "num_layers": layers,
            "config_sha256": hashlib.sha256(raw).hexdigest()}


@dataclass
class LensPack:
    """Concept directions over the hidden state at `layer` (transformers' hidden_states index).

    `parents[i]` is the concept id of concept i's parent in the hierarchy, or None for a root.
    `thresholds[i]`: the activation from which a token is tagged with concept i as it is recorded
    (None: never).
    """

    concept_ids: list[str]
    names: list[str]
    layer: int
    directions: np.ndarray  # float32 [n_concepts, hidden]
    biases: np.ndarray  # float32 [n_concepts]
    model: dict[str, Any]  # model_fingerprint(...)
    parents: list[str | None] | None = None
    method: str = "means"
    extra: dict[str, Any] = field(default_factory=dict)
    thresholds: list[float | None] | None = None

    def __post_init__(self) -> None:
        self.directions = np.asarray(self.directions, dtype=np.float32)
        self.biases = np.asarray(self.biases, dtype=np.float32)
        self.validate()

    @property
    def n_concepts(self) -> int:
        return len(self.concept_ids)

    @property
    def hidden_size(self) -> int:
        return int(self.directions.shape[1])

    def validate(self) -> None:
        """Raise ValueError naming the first bad field."""
        model = self.model
        if not isinstance(model, dict):
            raise ValueError("model: must be an object with hidden_size, num_layers, config_sha256")
        for key in ("hidden_size", "num_layers"):
            if not isinstance(model.get(key), int) or isinstance(model.get(key), bool) or model[key] < 1:
                raise ValueError(f"model.{key}: must be a positive integer, got {model.get(key)!r}")
        sha = model.get("config_sha256")
        if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise ValueError(f"model.config_sha256: must be 64 lowercase hex digits, got {sha!r}")
        ids = self.concept_ids
        if not isinstance(ids, list) or not ids:
            raise ValueError("concept_ids: must be a non-empty list")
        for cid in ids:
            if not isinstance(cid, str) or not _ID.match(cid):
                raise ValueError(f"concept_ids: bad id {cid!r} (letters, digits, _ . : / -; at most 128)")
        if len(set(ids)) != len(ids):
            dup = next(c for c in ids if ids.count(c) > 1)
            raise ValueError(f"concept_ids: duplicate id {dup!r}")
        n = len(ids)
        if not isinstance(self.names, list) or len(self.names) != n:
            raise ValueError(f"names: must be a list of {n} strings, one per concept id")
        if not all(isinstance(name, str) and name.strip() for name in self.names):
            raise ValueError("names: every name must be a non-empty string")
        if not isinstance(self.layer, int) or isinstance(self.layer, bool) \
                or not 0 <= self.layer <= model["num_layers"]:
            raise ValueError(f"layer: must be an integer in 0..{model['num_layers']}, got {self.layer!r}")
        if self.directions.ndim != 2 or self.directions.shape[0] != n:
            raise ValueError(f"directions: shape must be [{n}, hidden], got {list(self.directions.shape)}")
        if self.directions.shape[1] != model["hidden_size"]:
            raise ValueError(f"directions: hidden size {self.directions.shape[1]} differs from "
                             f"model.hidden_size {model['hidden_size']}")
        if not np.isfinite(self.directions).all():
            raise ValueError("directions: contains NaN or infinity")
        if self.biases.shape != (n,):
            raise ValueError(f"biases: shape must be [{n}], got {list(self.biases.shape)}")
        if not np.isfinite(self.biases).all():
            raise ValueError("biases: contains NaN or infinity")
        if not isinstance(self.method, str) or not self.method:
            raise ValueError("method: must be a non-empty string")
        if self.parents is not None:
            self._validate_parents()
        if self.thresholds is not None:
            self._validate_thresholds()
        self._validate_token_sets()

    def _validate_thresholds(self) -> None:
        values = self.thresholds
        if not isinstance(values, list) or len(values) != self.n_concepts:
            raise ValueError(f"thresholds: must be a list of {self.n_concepts} entries (a number or null)")
        for cid, value in zip(self.concept_ids, values):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not np.isfinite(value)):
                raise ValueError(f"thresholds: {cid!r} has {value!r}, not a finite number or null")

    def _validate_token_sets(self) -> None:
        """`extra.token_sets` (optional): concept id -> token ids, the concept for the logit lens."""
        sets = self.extra.get("token_sets") if isinstance(self.extra, dict) else None
        if sets is None:
            return
        ok = isinstance(sets, dict) and all(
            cid in self.concept_ids and isinstance(ids, list)
            and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids)
            for cid, ids in sets.items())
        if not ok:
            raise ValueError("extra.token_sets: must map concept ids to lists of token ids (integers >= 0)")

    def _validate_parents(self) -> None:
        ids, parents = self.concept_ids, self.parents
        if not isinstance(parents, list) or len(parents) != len(ids):
            raise ValueError(f"parents: must be a list of {len(ids)} entries (concept id or null)")
        known = set(ids)
        for cid, parent in zip(ids, parents):
            if parent is None:
                continue
            if parent not in known:
                raise ValueError(f"parents: {cid!r} names unknown parent {parent!r}")
        parent_of = dict(zip(ids, parents))
        for cid in ids:
            seen, node = set(), cid
            while node is not None:
                if node in seen:
                    raise ValueError(f"parents: cycle through {cid!r}")
                seen.add(node)
                node = parent_of[node]

    def check_model(self, model_dir: str | Path, strict: bool = True) -> None:
        """Raise ValueError when the pack was not made for this model (sizes always; the config
        hash too when `strict`)."""
        fp = model_fingerprint(model_dir)
        for key in ("hidden_size", "num_layers") + (("config_sha256",) if strict else ()):
            if fp[key] != self.model[key]:
                raise ValueError(f"model.{key}: pack has {self.model[key]!r}, model at {model_dir} "
                                 f"has {fp[key]!r}")

    def scores(self, hidden_states):
        """All activations, [T, n_concepts]: hidden_states [T, hidden] @ directions.T + biases.
        numpy in, numpy out; torch in, torch out (on the input's device, float32)."""
        if _is_torch(hidden_states):
            import torch

            d = torch.from_numpy(self.directions).to(hidden_states.device)
            b = torch.from_numpy(self.biases).to(hidden_states.device)
            h = hidden_states.to(torch.float32)
            if h.ndim != 2 or h.shape[1] != self.hidden_size:
                raise ValueError(f"hidden_states: shape must be [T, {self.hidden_size}], got {list(h.shape)}")
            return h @ d.T + b
        h = np.asarray(hidden_states, dtype=np.float32)
        if h.ndim != 2 or h.shape[1] != self.hidden_size:
            raise ValueError(f"hidden_states: shape must be [T, {self.hidden_size}], got {list(h.shape)}")
        return h @ self.directions.T + self.biases

    def project(self, hidden_states, k: int = 10):
        """Top-k concepts per token: (indices [T, k'] int64, values [T, k'] float32), highest first,
        k' = min(k, n_concepts). Indices point into `concept_ids`."""
        if k < 1:
            raise ValueError(f"k: must be at least 1, got {k}")
        k = min(k, self.n_concepts)
        s = self.scores(hidden_states)
        if _is_torch(s):
            values, indices = s.topk(k, dim=-1)
            return indices, values
        # argsort on the negated scores, stable so ties keep concept order (like torch on CPU).
        indices = np.argsort(-s, axis=-1, kind="stable")[:, :k].astype(np.int64)
        return indices, np.take_along_axis(s, indices, axis=-1)

    def top_concepts(self, hidden_state, k: int = 10) -> dict[str, float]:
        """One token's top-k as {concept_id: activation} (the XDB row's `concept_activations`)."""
        h = hidden_state.reshape(1, -1) if hasattr(hidden_state, "reshape") else np.asarray([hidden_state])
        indices, values = self.project(h, k)
        indices, values = np.asarray(_numpy(indices))[0], np.asarray(_numpy(values))[0]
        return {self.concept_ids[int(i)]: float(v) for i, v in zip(indices, values)}

    def concept_hierarchy(self) -> list[dict[str, Any]]:
        """[{"id", "name", "parent", "threshold"}] in pack order (parent None for a root or a flat pack;
        threshold None: no automatic tag)."""
        parents = self.parents or [None] * self.n_concepts
        thresholds = self.thresholds or [None] * self.n_concepts
        return [{"id": cid, "name": name, "parent": parent, "threshold": threshold}
                for cid, name, parent, threshold in zip(self.concept_ids, self.names, parents, thresholds)]

    def metadata(self) -> dict[str, Any]:
        meta = {"format": FORMAT, "layer": self.layer, "method": self.method, "model": self.model,
                "concepts": [{"id": cid, "name": name} | ({"parent": self.parents[i]} if self.parents else {})
                             | ({"threshold": self.thresholds[i]} if self.thresholds else {})
                             for i, (cid, name) in enumerate(zip(self.concept_ids, self.names))]}
        if self.extra:
            meta["extra"] = self.extra
        return meta


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def _numpy(x):
    return x.detach().cpu().numpy() if _is_torch(x) else x


def save_pack(pack: LensPack, out_dir: str | Path) -> Path:
    """Write `lens.safetensors` and `lens.json` into out_dir (created); returns out_dir."""
    from safetensors.numpy import save_file

    pack.validate()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file({"directions": np.ascontiguousarray(pack.directions, dtype=np.float32),
               "biases": np.ascontiguousarray(pack.biases, dtype=np.float32)},
              str(out / WEIGHTS_FILE), metadata={"format": FORMAT})
    (out / META_FILE).write_text(json.dumps(pack.metadata(), indent=2) + "\n")
    return out


def load_pack(pack_dir: str | Path) -> LensPack:
    """Read and validate a pack; ValueError names the bad field, FileNotFoundError a missing file."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    root = Path(pack_dir)
    meta_path, weights_path = root / META_FILE, root / WEIGHTS_FILE
    for path in (meta_path, weights_path):
        if not path.is_file():
            raise FileNotFoundError(f"lens pack {root}: missing {path.name}")
    try:
        meta = json.loads(meta_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{META_FILE}: not JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{META_FILE}: must be a JSON object")
    if meta.get("format") != FORMAT:
        raise ValueError(f"format: expected {FORMAT!r}, got {meta.get('format')!r}")
    concepts = meta.get("concepts")
    if not isinstance(concepts, list) or not all(isinstance(c, dict) for c in concepts):
        raise ValueError("concepts: must be a list of objects with id and name")
    for key in ("layer", "model"):
        if key not in meta:
            raise ValueError(f"{key}: missing from {META_FILE}")
    try:
        tensors = load_file(str(weights_path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise ValueError(f"{WEIGHTS_FILE}: unreadable ({exc})") from None
    for key in ("directions", "biases"):
        if key not in tensors:
            raise ValueError(f"{key}: missing from {WEIGHTS_FILE}")
        if tensors[key].dtype != np.float32:
            raise ValueError(f"{key}: dtype must be float32, got {tensors[key].dtype}")
    has_parents = any("parent" in c for c in concepts)
    has_thresholds = any("threshold" in c for c in concepts)
    return LensPack(thresholds=[c.get("threshold") for c in concepts] if has_thresholds else None,
                    concept_ids=[c.get("id") for c in concepts],
                    names=[c.get("name", c.get("id")) for c in concepts],
                    layer=meta["layer"], directions=tensors["directions"], biases=tensors["biases"],
                    model=meta["model"], parents=[c.get("parent") for c in concepts] if has_parents else None,
                    method=meta.get("method", "means"), extra=meta.get("extra") or {})
