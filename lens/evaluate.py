"""How well a lens pack separates its concepts on texts it was never trained on.

A text's score for a concept is the mean over its tokens of that concept's activation: what the
server records per token (`LensPack.scores` of the token's hidden state at the pack's layer),
averaged over the text. The projection is affine, so that equals the score of the text's mean
hidden state, the feature `text_features` computes, and one forward serves both.

Per concept: the ROC-AUC of those scores with the concept's held-out texts as positives and the
other concepts' held-out texts as negatives (a parent's positives are its descendants' texts). The
control fits the same method on the same training features with the texts' labels shuffled
(seeded): a lens that has learned the concepts scores well above it, which stays near 0.5.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lens.probes import fit


def roc_auc(scores: Sequence[float] | np.ndarray, labels: Sequence[bool] | np.ndarray) -> float:
    """P(a random positive scores above a random negative), ties counting half: the Mann-Whitney U
    over average ranks. ValueError without both classes."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=bool)
    if s.shape != y.shape or s.ndim != 1:
        raise ValueError(f"scores and labels: must be 1-D and of one length, got {s.shape} and {y.shape}")
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError("labels: need at least one positive and one negative")
    order = np.argsort(s, kind="mergesort")
    sorted_s = s[order]
    # Average rank (1-based) of each run of equal scores, so ties count half.
    starts = np.flatnonzero(np.r_[True, sorted_s[1:] != sorted_s[:-1]])
    ends = np.r_[starts[1:], len(s)]
    ranks = np.empty(len(s))
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)
    u = ranks[y].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


def concept_aucs(scores: np.ndarray, members: Sequence[Sequence[int]]) -> list[float]:
    """Per concept c: roc_auc(scores[:, c]) with the texts in members[c] as positives."""
    out = []
    for c, m in enumerate(members):
        labels = np.zeros(len(scores), dtype=bool)
        labels[list(m)] = True
        out.append(roc_auc(scores[:, c], labels))
    return out


def affine_scores(features: np.ndarray, directions: np.ndarray, biases: np.ndarray) -> np.ndarray:
    """[texts, concepts]: features @ directions.T + biases, as LensPack.scores."""
    return np.asarray(features, dtype=np.float32) @ directions.T + biases


def shuffled_members(members: Sequence[Sequence[int]], n_texts: int,
                     rng: np.random.Generator) -> list[list[int]]:
    """The same label sets moved onto a random permutation of the texts: every concept keeps its
    size (and a parent its children's texts), but the labels no longer follow the texts."""
    perm = rng.permutation(n_texts)
    return [sorted(int(perm[i]) for i in m) for m in members]


@dataclass
class HeldoutReport:
    concept_ids: list[str]
    auc: list[float]
    control_auc: list[float]  # mean over the shuffles
    n_texts: int
    shuffles: int
    seed: int

    @property
    def mean_auc(self) -> float:
        return float(np.mean(self.auc))

    @property
    def mean_control_auc(self) -> float:
        return float(np.mean(self.control_auc))

    def to_json(self) -> dict[str, Any]:
        """What the pack's `extra.heldout` records."""
        return {"score": "mean over the text's tokens of the token activation", "texts": self.n_texts,
                "control": f"labels shuffled: mean of {self.shuffles} permutations, seed {self.seed}",
                "mean_auc": round(self.mean_auc, 4), "mean_control_auc": round(self.mean_control_auc, 4),
                "auc": {c: round(a, 4) for c, a in zip(self.concept_ids, self.auc)},
                "control_auc": {c: round(a, 4) for c, a in zip(self.concept_ids, self.control_auc)}}


def heldout_table(heldout: dict[str, Any]) -> list[str]:
    """A pack's `extra.heldout` (HeldoutReport.to_json) as aligned text lines."""
    ids = list(heldout["auc"])
    width = max(len("concept"), *(len(c) for c in ids))
    lines = [f"{'concept':<{width}}  held-out AUC  control AUC"]
    lines += [f"{c:<{width}}  {heldout['auc'][c]:12.3f}  {heldout['control_auc'][c]:11.3f}" for c in ids]
    lines.append(f"{'mean':<{width}}  {heldout['mean_auc']:12.3f}  {heldout['mean_control_auc']:11.3f}")
    return lines


def heldout_report(concept_ids: Sequence[str], directions: np.ndarray, biases: np.ndarray,
                   train_features: np.ndarray, members: Sequence[Sequence[int]],
                   held_features: np.ndarray, held_members: Sequence[Sequence[int]], method: str,
                   shuffles: int = 10, seed: int = 0) -> HeldoutReport:
    """The fitted directions' held-out AUC per concept, and the control's: `method` refitted on the
    same training features with shuffled labels, averaged over `shuffles` seeded permutations (one
    shuffle's AUC per concept swings by ±0.1 or more on a dozen texts)."""
    auc = concept_aucs(affine_scores(held_features, directions, biases), held_members)
    rng = np.random.default_rng(seed)
    control = np.zeros(len(concept_ids))
    for _ in range(shuffles):
        d, b = fit(train_features, shuffled_members(members, len(train_features), rng), method)
        control += concept_aucs(affine_scores(held_features, d, b), held_members)
    return HeldoutReport(list(concept_ids), auc, list(control / shuffles), len(held_features), shuffles, seed)


@dataclass
class SweepRow:
    layer: int
    method: str
    mean_auc: float
    min_auc: float
    mean_control_auc: float


def choose(rows: Sequence[SweepRow], num_layers: int, tie: float = 0.005) -> SweepRow:
    """The best mean held-out AUC; among rows within `tie` of it (a text or two's difference), the
    layer nearest the middle: the embeddings see single tokens and the last layers increasingly the
    next token, while a middle layer holds the text read so far, what a concept is about."""
    best = max(r.mean_auc for r in rows)
    close = [r for r in rows if r.mean_auc >= best - tie]
    return min(close, key=lambda r: (abs(r.layer - num_layers / 2), -r.mean_auc))


def sweep_table(rows: Sequence[SweepRow]) -> list[str]:
    lines = ["layer  method    mean AUC  min AUC  control AUC"]
    lines += [f"{r.layer:5d}  {r.method:<8}  {r.mean_auc:8.3f}  {r.min_auc:7.3f}  {r.mean_control_auc:11.3f}"
              for r in rows]
    return lines
