"""Lens packs: round trip, validation naming the field, projection = matmul."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from lens import LensPack, load_pack, save_pack

MODEL = {"hidden_size": 16, "num_layers": 2, "config_sha256": "a" * 64}


def make_pack(n: int = 5, hidden: int = 16, seed: int = 0, **overrides) -> LensPack:
    rng = np.random.default_rng(seed)
    fields = dict(concept_ids=[f"c{i}" for i in range(n)], names=[f"Concept {i}" for i in range(n)],
                  layer=1, directions=rng.standard_normal((n, hidden)).astype(np.float32),
                  biases=rng.standard_normal(n).astype(np.float32), model=dict(MODEL))
    fields.update(overrides)
    return LensPack(**fields)


def test_round_trip(tmp_path: Path) -> None:
    pack = make_pack(parents=[None, "c0", "c0", None, "c3"], method="logistic", extra={"note": "x"})
    save_pack(pack, tmp_path / "p")
    back = load_pack(tmp_path / "p")
    assert back.concept_ids == pack.concept_ids and back.names == pack.names
    assert back.layer == 1 and back.method == "logistic" and back.model == MODEL
    assert back.parents == pack.parents and back.extra == {"note": "x"}
    assert back.directions.dtype == np.float32
    np.testing.assert_array_equal(back.directions, pack.directions)
    np.testing.assert_array_equal(back.biases, pack.biases)


def test_round_trip_without_hierarchy(tmp_path: Path) -> None:
    save_pack(make_pack(), tmp_path)
    assert load_pack(tmp_path).parents is None


@pytest.mark.parametrize("overrides, field", [
    (dict(concept_ids=[]), "concept_ids"),
    (dict(concept_ids=["c0", "c0", "c2", "c3", "c4"]), "concept_ids"),
    (dict(concept_ids=["c0", "bad id", "c2", "c3", "c4"]), "concept_ids"),
    (dict(names=["a", "b"]), "names"),
    (dict(layer=3), "layer"),
    (dict(layer=-1), "layer"),
    (dict(directions=np.zeros((5, 8), np.float32)), "directions"),
    (dict(directions=np.zeros((4, 16), np.float32)), "directions"),
    (dict(directions=np.full((5, 16), np.nan, np.float32)), "directions"),
    (dict(biases=np.zeros(4, np.float32)), "biases"),
    (dict(model={"hidden_size": 16, "num_layers": 2}), "model.config_sha256"),
    (dict(model={"hidden_size": 0, "num_layers": 2, "config_sha256": "a" * 64}), "model.hidden_size"),
    (dict(parents=[None, "nope", None, None, None]), "parents"),
    (dict(parents=["c1", "c0", None, None, None]), "parents"),
    (dict(parents=[None]), "parents"),
])
def test_bad_pack_rejected_naming_the_field(overrides, field) -> None:
    with pytest.raises(ValueError, match=f"^{field}"):
        make_pack(**overrides)


def _corrupt(tmp_path: Path, edit) -> Path:
    save_pack(make_pack(), tmp_path)
    meta = json.loads((tmp_path / "lens.json").read_text())
    edit(meta)
    (tmp_path / "lens.json").write_text(json.dumps(meta))
    return tmp_path


@pytest.mark.parametrize("edit, field", [
    (lambda m: m.update(format="other/9"), "format"),
    (lambda m: m.pop("layer"), "layer"),
    (lambda m: m.update(layer="1"), "layer"),
    (lambda m: m.update(concepts="x"), "concepts"),
    (lambda m: m["concepts"].pop(), "directions"),
    (lambda m: m["model"].update(hidden_size=32), "directions"),
    (lambda m: m["concepts"][1].update(parent="zzz"), "parents"),
])
def test_bad_files_rejected_naming_the_field(tmp_path: Path, edit, field) -> None:
    with pytest.raises(ValueError, match=f"^{field}"):
        load_pack(_corrupt(tmp_path, edit))


def test_missing_or_garbled_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_pack(tmp_path)
    save_pack(make_pack(), tmp_path)
    (tmp_path / "lens.safetensors").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="^lens.safetensors"):
        load_pack(tmp_path)
    from safetensors.numpy import save_file

    save_file({"directions": np.zeros((5, 16), np.float64), "biases": np.zeros(5, np.float32)},
              str(tmp_path / "lens.safetensors"))
    with pytest.raises(ValueError, match="^directions: dtype"):
        load_pack(tmp_path)


def test_projection_equals_manual_matmul() -> None:
    pack = make_pack(n=12, hidden=16, seed=3)
    h = np.random.default_rng(4).standard_normal((7, 16)).astype(np.float32)
    manual = h.astype(np.float64) @ pack.directions.T.astype(np.float64) + pack.biases
    np.testing.assert_allclose(pack.scores(h), manual, atol=1e-5, rtol=0)
    np.testing.assert_allclose(pack.scores(h), h @ pack.directions.T + pack.biases, atol=1e-6, rtol=0)
    idx, val = pack.project(h, k=10)
    assert idx.shape == (7, 10) and val.shape == (7, 10) and idx.dtype == np.int64
    order = np.argsort(-manual, axis=1)[:, :10]
    np.testing.assert_array_equal(idx, order)
    np.testing.assert_allclose(val, np.take_along_axis(manual, order, 1), atol=1e-5, rtol=0)
    assert (np.diff(val, axis=1) <= 0).all()
    # torch in, torch out; numpy and torch sum in different orders, so compare them at 1e-5 and
    # each against its own library's float32 matmul at 1e-6.
    tidx, tval = pack.project(torch.from_numpy(h), k=10)
    assert isinstance(tval, torch.Tensor)
    np.testing.assert_array_equal(tidx.numpy(), idx)
    np.testing.assert_allclose(tval.numpy(), val, atol=1e-5, rtol=0)
    manual32 = torch.from_numpy(h) @ torch.from_numpy(pack.directions).T + torch.from_numpy(pack.biases)
    assert torch.allclose(pack.scores(torch.from_numpy(h)), manual32, atol=1e-6, rtol=0)


def test_project_caps_k_and_top_concepts() -> None:
    pack = make_pack(n=3)
    h = np.ones((2, 16), np.float32)
    idx, val = pack.project(h, k=10)
    assert idx.shape == (2, 3)
    top = pack.top_concepts(h[0], k=2)
    assert list(top) == [pack.concept_ids[int(i)] for i in idx[0, :2]]
    with pytest.raises(ValueError, match="^hidden_states"):
        pack.project(np.ones((2, 8), np.float32))
    with pytest.raises(ValueError, match="^k"):
        pack.project(h, k=0)
