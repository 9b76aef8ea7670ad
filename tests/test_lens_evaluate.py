"""Held-out evaluation of lens packs (lens/evaluate.py): the AUC arithmetic, the shuffled-label control,
the layer choice, and held-out texts in examples files. Engine-free; the tiny model only for plumbing."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from lens.evaluate import SweepRow, choose, concept_aucs, heldout_report, heldout_table, roc_auc, shuffled_members
from lens.probes import fit
from lens.train import ConceptExamples, heldout_members, load_examples, train_pack

REPO = Path(__file__).resolve().parents[1]
REAL_EXAMPLES = REPO / "configs" / "lenses" / "smollm2-135m" / "examples.json"


def pairwise_auc(scores, labels) -> float:
    """The definition: over all (positive, negative) pairs, 1 when the positive is higher, ½ on a tie."""
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


def test_auc_perfect_inverse_and_all_tied() -> None:
    assert roc_auc([0.1, 0.2, 0.8, 0.9], [False, False, True, True]) == 1.0
    assert roc_auc([0.9, 0.8, 0.2, 0.1], [False, False, True, True]) == 0.0
    assert roc_auc([3.0, 3.0, 3.0, 3.0, 3.0], [True, False, True, False, False]) == 0.5


def test_auc_ties_count_half() -> None:
    # Positives 2 and 1; negatives 1 and 0: pairs (2>1, 2>0, 1=1, 1>0) -> 3.5 of 4.
    assert roc_auc([2, 1, 1, 0], [True, True, False, False]) == pytest.approx(3.5 / 4)


def test_auc_equals_the_pairwise_definition_on_random_tied_scores() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        scores = rng.integers(0, 5, 30).astype(float)  # many ties
        labels = rng.random(30) < 0.3
        labels[:2] = [True, False]
        assert roc_auc(scores, labels) == pytest.approx(pairwise_auc(scores, labels), abs=1e-12)


def test_auc_needs_both_classes_and_matching_shapes() -> None:
    with pytest.raises(ValueError, match="^labels"):
        roc_auc([1.0, 2.0], [True, True])
    with pytest.raises(ValueError, match="^scores and labels"):
        roc_auc([1.0, 2.0, 3.0], [True, False])


def test_shuffled_members_keep_sizes_and_move_labels() -> None:
    members = [[0, 1, 2], [3, 4], [0, 1, 2, 3, 4]]
    out = shuffled_members(members, 10, np.random.default_rng(1))
    assert [len(m) for m in out] == [3, 2, 5]
    assert set(out[0]) | set(out[1]) == set(out[2])  # a parent keeps its children's texts
    assert out != members


def clusters(n_concepts=4, per=30, hidden=32, seed=0):
    rng = np.random.default_rng(seed)
    means = rng.standard_normal((n_concepts, hidden)) * 2
    x = np.concatenate([means[c] + rng.standard_normal((per, hidden)) for c in range(n_concepts)])
    members = [list(range(c * per, (c + 1) * per)) for c in range(n_concepts)]
    return x.astype(np.float32), members


@pytest.mark.parametrize("method", ["means", "logistic"])
def test_report_separates_learned_concepts_from_the_shuffled_control(method: str) -> None:
    train, members = clusters(seed=0)
    held, held_members = clusters(per=10, seed=0)
    # Same concept means (same seed), fresh noise: held-out texts of the same concepts.
    held = held + np.random.default_rng(5).standard_normal(held.shape).astype(np.float32)
    d, b = fit(train, members, method)
    report = heldout_report(["a", "b", "c", "d"], d, b, train, members, held, held_members, method, shuffles=10)
    assert report.mean_auc > 0.95 and min(report.auc) > 0.9
    assert 0.3 < report.mean_control_auc < 0.7
    meta = report.to_json()
    assert set(meta["auc"]) == {"a", "b", "c", "d"} and meta["mean_auc"] == pytest.approx(report.mean_auc, abs=1e-4)
    lines = heldout_table(meta)
    assert lines[0].split()[0] == "concept" and lines[-1].split()[0] == "mean" and len(lines) == 6


def test_concept_aucs_per_column() -> None:
    scores = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0]])
    assert concept_aucs(scores, [[0, 1], [2]]) == [1.0, 1.0]


def test_choose_prefers_the_middle_layer_among_ties() -> None:
    rows = [SweepRow(3, "logistic", 0.997, 0.98, 0.5), SweepRow(15, "logistic", 0.996, 0.98, 0.5),
            SweepRow(27, "logistic", 1.0, 1.0, 0.5), SweepRow(15, "means", 0.7, 0.4, 0.5)]
    assert (choose(rows, 30).layer, choose(rows, 30).method) == (15, "logistic")
    assert choose(rows, 30, tie=0.0).layer == 27


def test_heldout_texts_load_and_must_not_leak(tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"concepts": [{"id": "a", "examples": ["x"], "heldout": ["y"]},
                                             {"id": "b", "examples": ["z"]}]}))
    concepts = load_examples(good)
    assert concepts[0].heldout == ["y"] and concepts[1].heldout == []
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"concepts": [{"id": "a", "examples": ["x"], "heldout": ["z"]},
                                            {"id": "b", "examples": ["z"], "heldout": ["w"]}]}))
    with pytest.raises(ValueError, match="heldout: 'z' is also a training example"):
        load_examples(bad)
    bad.write_text(json.dumps({"concepts": [{"id": "a", "examples": ["x"], "heldout": [3]}]}))
    with pytest.raises(ValueError, match=r"concepts\[0\].heldout"):
        load_examples(bad)


def test_heldout_members_follow_the_hierarchy() -> None:
    concepts = [ConceptExamples("motion", "Motion", None, []),
                ConceptExamples("right", "Right", "motion", ["r1"], ["hr1", "hr2"]),
                ConceptExamples("left", "Left", "motion", ["l1"], ["hl1"]),
                ConceptExamples("count", "Count", None, ["n1"], ["hn1"])]
    texts, members = heldout_members(concepts)
    assert texts == ["hr1", "hr2", "hl1", "hn1"] and members == [[0, 1, 2], [0, 1], [2], [3]]
    assert heldout_members(concepts[:1] + [ConceptExamples("x", "X", None, ["t"])]) == ([], [])


def test_real_examples_file_has_ten_concepts_with_heldout_texts() -> None:
    concepts = load_examples(REAL_EXAMPLES)
    assert len(concepts) >= 8 and all(c.parent is None for c in concepts)
    assert all(len(c.examples) >= 25 and len(c.heldout) >= 10 for c in concepts)


def test_train_pack_records_heldout_figures_on_the_tiny_model(tiny_model_dir: Path) -> None:
    # Plumbing only: the tiny model is random, its figures mean nothing.
    concepts = [ConceptExamples("a", "A", None, ["left one", "left two", "left three"], ["left four"]),
                ConceptExamples("b", "B", None, ["right one", "right two", "right three"], ["right four"])]
    pack = train_pack(tiny_model_dir, concepts, layer=1)
    heldout = pack.extra["heldout"]
    assert set(heldout["auc"]) == set(heldout["control_auc"]) == {"a", "b"} and heldout["texts"] == 2
    assert 0.0 <= heldout["mean_auc"] <= 1.0
    assert "heldout" not in train_pack(tiny_model_dir, [ConceptExamples(c.id, c.name, None, c.examples)
                                                        for c in concepts], layer=1).extra
