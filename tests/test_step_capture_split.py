"""The worker's split of a token's concept scores (server/capture/step_capture.py): the top k of the visible
concepts, indexing them alone, and the top audit_k of the hidden ones (lens.hidden), indexing those; with
no hidden concept the indices are the pack's, as they always were."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch

from lens.pack import load_pack
from server.capture.step_capture import LensSettings, StepCapture

PACK = Path(__file__).resolve().parents[1] / ".cache" / "lenses" / "tiny-demo"


def capture(hidden: tuple[str, ...], k: int, audit_k: int) -> tuple[StepCapture, list[str]]:
    pack = load_pack(PACK)
    sender = SimpleNamespace(hidden_k=-1)  # stands in for the BundlingSender: only hidden_k is read here
    made = StepCapture(pack, "final", k, "cpu", sender, vocab_size=0, hidden=hidden, audit_k=audit_k)  # type: ignore[arg-type]
    return made, list(pack.concept_ids)


def test_visible_and_hidden_concepts_are_ranked_apart() -> None:
    made, ids = capture(("negation", "motion"), k=2, audit_k=1)
    assert made.sender.hidden_k == 1
    visible = [c for c in ids if c not in ("negation", "motion")]
    hidden = [c for c in ids if c in ("negation", "motion")]
    scores = torch.tensor([[float(i) for i in range(len(ids))]])  # the pack's last concept scores highest
    values, index = made.visible.top(scores)
    assert [visible[i] for i in index[0].tolist()] == sorted(visible, key=ids.index, reverse=True)[:2]
    assert values[0].tolist() == [float(ids.index(visible[i])) for i in index[0].tolist()]
    assert made.hidden is not None
    values, index = made.hidden.top(scores)
    assert [hidden[i] for i in index[0].tolist()] == [max(hidden, key=ids.index)]


def test_without_hidden_concepts_the_indices_are_the_packs() -> None:
    made, ids = capture((), k=3, audit_k=10)
    assert made.hidden is None and made.visible.whole and made.sender.hidden_k == 0
    scores = torch.tensor([[0.0, 5.0, 1.0, 4.0, 2.0, 3.0][:len(ids)]])
    _, index = made.visible.top(scores)
    assert index[0].tolist() == scores[0].topk(3).indices.tolist()


def test_the_settings_carry_the_hidden_concepts_to_the_worker() -> None:
    config = SimpleNamespace(additional_config={"ahc_lens": {"pack": "p", "k": 3, "ipc": "ipc://x",
                                                             "hidden": ["negation"], "audit_k": 1}})
    settings = LensSettings.from_vllm_config(config)
    assert settings is not None and settings.hidden == ("negation",) and settings.audit_k == 1
