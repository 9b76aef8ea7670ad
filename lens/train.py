"""Build a lens pack from labelled example texts.

Examples file (JSON):

    {"concepts": [{"id": "motion", "name": "Motion"},
                  {"id": "motion-right", "name": "Moving right", "parent": "motion",
                   "examples": ["the block moves right", ...]}, ...]}

A concept may also list `heldout` texts: never trained on, they measure the pack (lens/evaluate.py:
each concept's held-out ROC-AUC, and a control trained on shuffled labels), and the figures go into
the pack's `extra.heldout`.

A concept without examples of its own (a parent) takes the union of its descendants' examples.
Each text's feature is the mean over its tokens of the hidden state at `layer` (transformers'
`output_hidden_states` index) from a CPU float32 forward.

`means`: w = d / |d|², d = mean(concept texts) − mean(all other texts), b = −w·(midpoint), so a
text at the concept mean scores +0.5 and one at the others' mean −0.5.
`logistic`: a one-vs-rest L2-regularised logistic probe per concept (torch L-BFGS on standardised
features, folded back into raw hidden-state space); the activation is the probe's logit.

Either way the pack also gets `extra.token_sets`: per concept, the tokens relatively more frequent in
its texts than in the others, for the logit-lens fallback where hidden states cannot be reached.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from lens.evaluate import SweepRow, heldout_report
from lens.pack import LensPack, model_fingerprint
from lens.probes import METHODS, fit


@dataclass
class ConceptExamples:
    id: str
    name: str
    parent: str | None
    examples: list[str]
    heldout: list[str] = field(default_factory=list)


def load_examples(path: str | Path) -> list[ConceptExamples]:
    """Read and check an examples file; ValueError names the bad field."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"examples file not found: {p}")
    try:
        data = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{p}: not JSON ({exc})") from None
    concepts = data.get("concepts") if isinstance(data, dict) else None
    if not isinstance(concepts, list) or not concepts:
        raise ValueError(f"{p}: concepts: must be a non-empty list")
    out: list[ConceptExamples] = []
    for i, c in enumerate(concepts):
        if not isinstance(c, dict) or not isinstance(c.get("id"), str):
            raise ValueError(f"{p}: concepts[{i}].id: must be a string")
        texts = {}
        for key in ("examples", "heldout"):
            texts[key] = c.get(key, [])
            if not isinstance(texts[key], list) or not all(isinstance(t, str) and t.strip() for t in texts[key]):
                raise ValueError(f"{p}: concepts[{i}].{key}: must be a list of non-empty strings")
        parent = c.get("parent")
        if parent is not None and not isinstance(parent, str):
            raise ValueError(f"{p}: concepts[{i}].parent: must be a concept id or null")
        out.append(ConceptExamples(c["id"], str(c.get("name") or c["id"]), parent, list(texts["examples"]),
                                   list(texts["heldout"])))
    leaked = {t for c in out for t in c.heldout} & {t for c in out for t in c.examples}
    if leaked:
        raise ValueError(f"{p}: heldout: {sorted(leaked)[0]!r} is also a training example")
    return out


def heldout_members(concepts: Sequence[ConceptExamples]) -> tuple[list[str], list[list[int]]]:
    """concept_members over the held-out texts (a parent takes its descendants'); ([], []) when the
    file has none."""
    if not any(c.heldout for c in concepts):
        return [], []
    return concept_members([replace(c, examples=c.heldout) for c in concepts])


def concept_members(concepts: Sequence[ConceptExamples]) -> tuple[list[str], list[list[int]]]:
    """All distinct texts, and per concept the indices of its texts (own plus descendants')."""
    texts: list[str] = []
    index: dict[str, int] = {}
    own: dict[str, set[int]] = {}
    for c in concepts:
        own[c.id] = set()
        for t in c.examples:
            if t not in index:
                index[t] = len(texts)
                texts.append(t)
            own[c.id].add(index[t])
    children: dict[str, list[str]] = {}
    for c in concepts:
        if c.parent is not None:
            children.setdefault(c.parent, []).append(c.id)

    def collect(cid: str, seen: frozenset) -> set[int]:
        if cid in seen:
            raise ValueError(f"parents: cycle through {cid!r}")
        result = set(own.get(cid, ()))
        for child in children.get(cid, []):
            result |= collect(child, seen | {cid})
        return result

    members = [sorted(collect(c.id, frozenset())) for c in concepts]
    for c, m in zip(concepts, members):
        if not m:
            raise ValueError(f"examples: concept {c.id!r} has no examples (nor children with any)")
    for c, m in zip(concepts, members):
        if len(m) == len(texts):
            raise ValueError(f"examples: concept {c.id!r} covers every text; nothing to contrast with")
    return texts, members


def text_features(model_dir: str | Path, texts: Sequence[str], layer: int,
                  batch_size: int = 16) -> np.ndarray:
    """[len(texts), hidden] float32: per text, the mean over its tokens of hidden_states[layer]."""
    return layer_features(model_dir, texts, [layer], batch_size)[layer]


def layer_features(model_dir: str | Path, texts: Sequence[str], layers: Sequence[int],
                   batch_size: int = 16) -> dict[int, np.ndarray]:
    """text_features for several layers from one forward per batch (a layer sweep)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.eval()
    n_layers = model.config.get_text_config().num_hidden_layers
    for layer in layers:
        if not 0 <= layer <= n_layers:
            raise ValueError(f"layer: must be in 0..{n_layers} for this model, got {layer}")
    feats: dict[int, list] = {layer: [] for layer in layers}
    with torch.inference_mode():
        for start in range(0, len(texts), batch_size):
            batch = tokenizer(list(texts[start:start + batch_size]), return_tensors="pt", padding=True)
            out = model(**batch, output_hidden_states=True, use_cache=False)
            mask = batch["attention_mask"].unsqueeze(-1).to(torch.float32)
            for layer in layers:
                h = out.hidden_states[layer].to(torch.float32)
                feats[layer].append((h * mask).sum(1) / mask.sum(1).clamp(min=1))
    return {layer: torch.cat(f).numpy().astype(np.float32) for layer, f in feats.items()}


def token_sets(model_dir: str | Path, texts: Sequence[str], members: Sequence[Sequence[int]],
               size: int = 32) -> list[list[int]]:
    """Per concept, the tokens of its texts that are relatively more frequent there than in the other
    texts (at most `size`, most frequent first): the concept as a set of tokens, for the logit lens
    where a model's hidden states cannot be reached."""
    from collections import Counter

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    counts = [Counter(tokenizer.encode(t, add_special_tokens=False)) for t in texts]
    sets = []
    for m in members:
        inside, outside = Counter(), Counter()
        for i, c in enumerate(counts):
            (inside if i in set(m) else outside).update(c)
        n_in, n_out = max(sum(inside.values()), 1), max(sum(outside.values()), 1)
        distinctive = [t for t, n in inside.most_common() if n / n_in > outside[t] / n_out]
        sets.append(distinctive[:size])
    return sets


def train_pack(model_dir: str | Path, examples: str | Path | Sequence[ConceptExamples], layer: int,
               method: str = "means") -> LensPack:
    """Compute features on the CPU with transformers and fit one direction per concept."""
    if method not in METHODS:
        raise ValueError(f"method: must be one of {', '.join(METHODS)}, got {method!r}")
    concepts = load_examples(examples) if isinstance(examples, (str, Path)) else list(examples)
    fingerprint = model_fingerprint(model_dir)
    if not 0 <= layer <= fingerprint["num_layers"]:
        raise ValueError(f"layer: must be in 0..{fingerprint['num_layers']} for this model, got {layer}")
    texts, members = concept_members(concepts)
    held_texts, held_members = heldout_members(concepts)
    # One model load and forward for both: the held-out texts only measure the fitted directions.
    all_features = text_features(model_dir, texts + held_texts, layer)
    features, held_features = all_features[:len(texts)], all_features[len(texts):]
    directions, biases = fit(features, members, method)
    parents = [c.parent for c in concepts]
    # A token is tagged with a concept as it is recorded when it activates it as strongly as the
    # concept's own examples do on average: about half of those, and few others.
    scores = np.asarray(features, dtype=np.float64) @ directions.T.astype(np.float64) + biases
    thresholds: list[float | None] = [round(float(scores[list(m), i].mean()), 6) if m else None
                                      for i, m in enumerate(members)]
    extra: dict[str, Any] = {"examples": {c.id: len(m) for c, m in zip(concepts, members)},
                             "features": "mean over tokens",
                             "token_sets": {c.id: ids for c, ids in zip(concepts, token_sets(model_dir, texts, members))
                                            if ids}}
    if held_texts:
        extra["heldout"] = heldout_report([c.id for c in concepts], directions, biases, features, members,
                                          held_features, held_members, method).to_json()
    return LensPack(concept_ids=[c.id for c in concepts], names=[c.name for c in concepts], layer=layer,
                    directions=directions, biases=biases, model=fingerprint,
                    parents=parents if any(p is not None for p in parents) else None,
                    method=method, extra=extra, thresholds=thresholds)


def sweep(model_dir: str, concepts: Sequence[ConceptExamples], layers: Sequence[int], methods: Sequence[str],
          shuffles: int = 10) -> list[SweepRow]:
    """Held-out figures for every (layer, method): to choose the pack's layer by measurement. One
    forward per batch of texts serves every layer."""
    texts, members = concept_members(concepts)
    held_texts, held_members = heldout_members(concepts)
    if not held_texts:
        raise ValueError("examples: a sweep needs held-out texts (`heldout` lists)")
    feats = layer_features(model_dir, texts + held_texts, layers)
    ids = [c.id for c in concepts]
    rows = []
    for layer in layers:
        train, held = feats[layer][:len(texts)], feats[layer][len(texts):]
        for method in methods:
            d, b = fit(train, members, method)
            r = heldout_report(ids, d, b, train, members, held, held_members, method, shuffles)
            rows.append(SweepRow(layer, method, r.mean_auc, min(r.auc), r.mean_control_auc))
    return rows
