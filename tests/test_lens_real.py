"""The real model's lens pack, as `make setup` builds it: its held-out figures recomputed here with
transformers, token by token the way the server records them, so the pack cannot silently degrade.

The model runs in the dtype the bundled config serves it in (configs/cpu-small.yaml); each held-out
text's tokens are projected with `LensPack.scores` and averaged (lens/evaluate.py). A second
figure takes each text's strongest token after the first instead: the server records single tokens,
never a text's first (it follows the chat template), so single token activations must carry the
concept too, not only their average.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from core.config import cache_dir, load_config
from lens import load_pack
from lens.evaluate import concept_aucs, heldout_report
from lens.train import concept_members, heldout_members, load_examples, text_features

pytestmark = pytest.mark.real_model

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "configs" / "lenses" / "smollm2-135m" / "examples.json"
MEAN_FLOOR = 0.9  # the goal for the mean held-out AUC
CONCEPT_FLOOR = 0.85  # no concept may fall far behind the others
CONTROL = (0.35, 0.65)  # shuffled labels: chance, give or take a few texts


@pytest.fixture(scope="module")
def real_lens():
    model, pack_dir = cache_dir() / "models" / "smollm2-135m", cache_dir() / "lenses" / "smollm2-135m"
    missing = [str(p) for p in (model / "model.safetensors", pack_dir / "lens.json") if not p.is_file()]
    if missing:
        pytest.fail(f"the real model or its lens pack is missing ({', '.join(missing)}): run `make setup`")
    pack = load_pack(pack_dir)
    pack.check_model(model)
    return model, pack


def token_scores(model_dir: Path, texts: list[str], layer: int, pack) -> list[np.ndarray]:
    """Per text [tokens, concepts]: each token's activations, the model in the served dtype."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    served = load_config("cpu-small").engine.dtype
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype="auto" if served == "auto" else getattr(torch, served)).eval()
    out = []
    with torch.inference_mode():
        for text in texts:
            ids = tokenizer(text, return_tensors="pt")
            hidden = model(**ids, output_hidden_states=True, use_cache=False).hidden_states[layer][0]
            out.append(pack.scores(hidden.float()).numpy())
    return out


def test_real_lens_separates_heldout_texts_well_above_a_shuffled_control(real_lens) -> None:
    model_dir, pack = real_lens
    concepts = load_examples(EXAMPLES)
    assert pack.concept_ids == [c.id for c in concepts], "the pack is stale: rerun `make setup`"
    held_texts, held_members = heldout_members(concepts)
    per_token = token_scores(model_dir, held_texts, pack.layer, pack)

    mean_auc = concept_aucs(np.stack([s.mean(0) for s in per_token]), held_members)
    table = "\n".join(f"{c}: {a:.3f}" for c, a in zip(pack.concept_ids, mean_auc))
    assert np.mean(mean_auc) >= MEAN_FLOOR, table
    assert min(mean_auc) >= CONCEPT_FLOOR, table
    # The figure `ahc lens train` stored (float32, batched with padding) is the one measured here.
    stored = pack.extra["heldout"]
    assert stored["mean_auc"] == pytest.approx(np.mean(mean_auc), abs=0.02), table

    strongest = concept_aucs(np.stack([(s[1:] if len(s) > 1 else s).max(0) for s in per_token]), held_members)
    assert np.mean(strongest) >= MEAN_FLOOR, "\n".join(f"{c}: {a:.3f}" for c, a in zip(pack.concept_ids, strongest))

    # The control: the pack's method refitted on the training texts' float32 features (as `ahc lens
    # train` does) with shuffled labels, scored on the held-out texts.
    texts, members = concept_members(concepts)
    features = text_features(model_dir, texts + held_texts, pack.layer)
    report = heldout_report(pack.concept_ids, pack.directions, pack.biases, features[:len(texts)], members,
                            features[len(texts):], held_members, pack.method)
    assert report.mean_auc >= MEAN_FLOOR, report.to_json()
    assert CONTROL[0] <= report.mean_control_auc <= CONTROL[1], report.to_json()
