"""`ahc lens train`: the fitting math on synthetic hidden states (where it must separate concepts) and
the plumbing on the tiny model (transformers forward, pack files, CLI exit codes)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from cli_runner import invoke

from lens import load_pack
from lens.probes import fit
from lens.train import ConceptExamples, concept_members, load_examples, text_features, train_pack

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "configs" / "lenses" / "tiny-demo" / "examples.json"


def synthetic(n_concepts=5, per=20, hidden=64, noise=1.0, seed=0):
    """Features = a shared offset + the concept's mean + isotropic noise."""
    rng = np.random.default_rng(seed)
    means = rng.standard_normal((n_concepts, hidden)) * 1.5
    offset = rng.standard_normal(hidden) * 5
    x = np.concatenate([offset + means[c] + noise * rng.standard_normal((per, hidden))
                        for c in range(n_concepts)]).astype(np.float32)
    labels = np.repeat(np.arange(n_concepts), per)
    return x, labels


@pytest.mark.parametrize("method", ["means", "logistic"])
def test_directions_rank_held_out_examples_of_their_concept_first(method) -> None:
    x, labels = synthetic()
    train = np.arange(len(x)) % 4 != 0  # hold out every fourth example
    held_x, held_labels = x[~train], labels[~train]
    train_idx = np.flatnonzero(train)
    members = [[i for i, j in enumerate(train_idx) if labels[j] == c] for c in range(5)]
    directions, biases = fit(x[train], members, method)
    assert directions.shape == (5, 64) and directions.dtype == np.float32 and biases.shape == (5,)
    scores = held_x @ directions.T + biases
    for c in range(5):
        own, other = scores[held_labels == c, c], scores[held_labels != c, c]
        assert own.min() > other.max(), (method, c)
    assert (scores.argmax(1) == held_labels).all()


def test_means_is_calibrated_half_and_minus_half() -> None:
    x, labels = synthetic()
    members = [list(np.flatnonzero(labels == c)) for c in range(5)]
    directions, biases = fit(x, members, "means")
    for c in range(5):
        s = x @ directions[c] + biases[c]
        assert s[labels == c].mean() == pytest.approx(0.5, abs=1e-4)
        assert s[labels != c].mean() == pytest.approx(-0.5, abs=1e-4)


def test_parent_takes_its_childrens_examples() -> None:
    concepts = [ConceptExamples("motion", "Motion", None, []),
                ConceptExamples("right", "Right", "motion", ["r1", "r2"]),
                ConceptExamples("left", "Left", "motion", ["l1"]),
                ConceptExamples("count", "Count", None, ["n1", "n2"])]
    texts, members = concept_members(concepts)
    assert texts == ["r1", "r2", "l1", "n1", "n2"]
    assert members == [[0, 1, 2], [0, 1], [2], [3, 4]]
    with pytest.raises(ValueError, match="covers every text"):
        concept_members([ConceptExamples("a", "A", None, ["x"])])
    with pytest.raises(ValueError, match="no examples"):
        concept_members([ConceptExamples("a", "A", None, ["x"]), ConceptExamples("b", "B", None, [])])


def test_bad_method_and_bad_examples(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="^method"):
        fit(np.zeros((2, 4), np.float32), [[0]], "pca")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"concepts": [{"id": "a", "examples": [""]}]}))
    with pytest.raises(ValueError, match=r"concepts\[0\].examples"):
        load_examples(bad)


def test_demo_examples_file_is_valid() -> None:
    concepts = load_examples(EXAMPLES)
    assert len(concepts) >= 5
    texts, members = concept_members(concepts)
    assert all(len(m) >= 10 for m in members)


def test_features_equal_a_manual_transformers_forward(tiny_model_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    texts = ["the block moves right", "A and B collide, twice", "no"]
    feats = text_features(tiny_model_dir, texts, layer=1)  # batched with padding
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    for i, text in enumerate(texts):
        ids = tok(text, return_tensors="pt")
        with torch.inference_mode():
            h = model(**ids, output_hidden_states=True).hidden_states[1][0]
        np.testing.assert_allclose(feats[i], h.mean(0).numpy(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("method", ["means", "logistic"])
def test_train_pack_on_the_tiny_model(tiny_model_dir: Path, tmp_path: Path, method: str) -> None:
    from lens import save_pack

    pack = train_pack(tiny_model_dir, EXAMPLES, layer=1, method=method)
    pack.check_model(tiny_model_dir)
    assert pack.concept_ids[:3] == ["motion", "motion-right", "motion-left"]
    assert pack.parents[1] == "motion" and pack.parents[0] is None
    assert pack.directions.shape == (pack.n_concepts, 128)
    save_pack(pack, tmp_path)
    back = load_pack(tmp_path)
    np.testing.assert_array_equal(back.directions, pack.directions)
    # On the training texts each concept's own examples score above the rest on average.
    concepts = load_examples(EXAMPLES)
    texts, members = concept_members(concepts)
    scores = pack.scores(text_features(tiny_model_dir, texts, layer=1))
    for c, m in enumerate(members):
        inside = np.zeros(len(texts), bool)
        inside[m] = True
        assert scores[inside, c].mean() > scores[~inside, c].mean()


def test_train_rejects_a_layer_past_the_model(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="^layer"):
        train_pack(tiny_model_dir, EXAMPLES, layer=3)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    # In this process: a subprocess would import torch and transformers again for each of its six runs.
    from lens.cli import app

    return invoke(app, *args)


def test_cli_exit_codes(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "pack"
    ok = run_cli("train", "--model", str(tiny_model_dir), "--examples", str(EXAMPLES), "--layer", "1",
                 "--out", str(out))
    assert ok.returncode == 0, ok.stderr
    assert load_pack(out).n_concepts == len(load_examples(EXAMPLES))
    shown = run_cli("show", str(out))
    assert shown.returncode == 0 and "motion-right" in shown.stdout

    usage = run_cli("train", "--model", str(tiny_model_dir), "--examples", str(EXAMPLES), "--layer", "1",
                    "--out", str(out), "--method", "pca")
    assert usage.returncode == 2
    assert run_cli("train", "--model", str(tiny_model_dir)).returncode == 2

    for args in (["--layer", "9", "--examples", str(EXAMPLES)],
                 ["--layer", "1", "--examples", str(tmp_path / "missing.json")]):
        bad = run_cli("train", "--model", str(tiny_model_dir), "--out", str(tmp_path / "x"), *args)
        assert bad.returncode == 1
        lines = bad.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), bad.stderr
