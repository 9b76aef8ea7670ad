"""Inside vLLM's worker: after each forward, the top-k concepts of the rows that produce a token.

Which state is read (decided once, at model load, before any warm-up or compilation):
- `aux`: the residual stream after decoder layer L, from vLLM's EAGLE-3 plumbing
  (`set_aux_hidden_state_layers((L,))` + `use_aux_hidden_state_outputs`): the model returns
  `(hidden, [h_L])`, h_L = hidden_states + residual = transformers' `hidden_states[L]`. It is traced
  into torch.compile and CUDA graphs like EAGLE-3's, so neither has to be turned off.
- `final`: L == num_layers: transformers' last entry is the normed output, which is exactly the
  `sample_hidden_states` vLLM already gathers for the LM head.
- `logit_lens`: the model has no aux-hidden-state interface: a concept is a set of token ids (the
  pack's `extra.token_sets`) and its activation is log P(next token in the set) from the row's logits.

Rows: the last scheduled token of each request (`query_start_loc[1:] - 1`, the logits rows of a
non-speculative step), kept only where vLLM will keep the sampled token (`discard_request_mask` is
False). The produced token's position is `num_computed + num_scheduled` (`optimistic_seq_lens_cpu`),
its output index that minus the prompt length. Prompt tokens served from the prefix cache are never
computed, so nothing is measured for them; partial prefill chunks are discarded rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from lens.pack import LensPack, load_pack
from lens.side_channel import ActivationSender, BundlingSender, engine_key

MODES = ("aux", "final", "logit_lens")


@dataclass(frozen=True)
class LensSettings:
    """What the API process tells the worker, in `--additional-config '{"ahc_lens": {...}}'`."""

    pack: str
    k: int
    ipc: str
    source: str = "auto"  # "auto" | "hidden_state" | "logit_lens"
    hidden: tuple[str, ...] = ()  # concepts measured for the audit log alone (lens.hidden)
    audit_k: int = 0  # hidden concepts kept per token

    @classmethod
    def from_vllm_config(cls, vllm_config: Any) -> LensSettings | None:
        raw = (getattr(vllm_config, "additional_config", None) or {}).get("ahc_lens")
        if raw is None:
            return None
        return cls(**{**raw, "hidden": tuple(raw.get("hidden") or ())})


def choose_mode(model: Any, pack: LensPack, num_layers: int, source: str) -> str:
    from vllm.model_executor.models.interfaces import supports_eagle3

    has_token_sets = bool(pack.extra.get("token_sets"))
    if source == "logit_lens" or (source == "auto" and pack.layer < num_layers and not supports_eagle3(model)):
        if not has_token_sets:
            why = "" if source == "logit_lens" else f"{type(model).__name__} exposes no hidden states and "
            raise ValueError(f"lens: {why}the pack has no extra.token_sets for a logit lens")
        return "logit_lens"
    if pack.layer == num_layers:
        return "final"
    if not supports_eagle3(model):
        raise ValueError(f"lens: {type(model).__name__} does not expose hidden states (no EAGLE-3 "
                         "aux-hidden-state interface); use a pack with token_sets (logit lens)")
    return "aux"


class StepCapture:
    """Each row's top `k` visible concepts and, with hidden ones (`LensSettings.hidden`), its top `audit_k`
    hidden ones after them: [rows, k + audit_k] a message, the visible indexing the pack's visible concepts
    and the hidden its hidden ones (each in pack order), so the writer splits them apart."""

    def __init__(self, pack: LensPack, mode: str, k: int, device: Any, sender: BundlingSender,
                 vocab_size: int, hidden: tuple[str, ...] = (), audit_k: int = 0) -> None:
        import torch

        self.mode, self.sender = mode, sender
        self.source = "logit_lens" if mode == "logit_lens" else "hidden_state"
        self.directions = torch.from_numpy(pack.directions).to(device)
        self.biases = torch.from_numpy(pack.biases).to(device)
        columns = list(range(pack.n_concepts))  # the pack concept of each score column
        if mode == "logit_lens":
            self.token_sets, self.token_mask, self.concepts = token_set_tensors(pack, device, vocab_size)
            columns = self.concepts.tolist()
        visible = [i for i, c in enumerate(pack.concept_ids) if c not in hidden]
        secret = [i for i, c in enumerate(pack.concept_ids) if c in hidden]
        self.visible = _Part(columns, visible, k, device)
        self.hidden = _Part(columns, secret, audit_k, device) if secret and audit_k else None
        self.sender.hidden_k = 0 if self.hidden is None else self.hidden.k

    @classmethod
    def attach(cls, runner: Any, settings: LensSettings, ship: bool) -> StepCapture | None:
        """Load the pack and switch the model to expose the lens layer. Must run after the model is
        loaded and before warm-up: compiled graphs keep whatever the model returned when traced."""
        if runner.speculative_config is not None:
            raise ValueError("lens capture does not support speculative decoding")
        pack = load_pack(settings.pack)
        model = runner.get_model()
        hf_config = runner.model_config.hf_text_config
        mode = choose_mode(model, pack, hf_config.num_hidden_layers, settings.source)
        if mode == "aux":
            model.set_aux_hidden_state_layers((pack.layer,))
            runner.use_aux_hidden_state_outputs = True
        if not ship:  # every rank must run the same graph; one ships
            return None
        sender = BundlingSender(ActivationSender(settings.ipc), on_host=runner.device.type == "cpu")
        return cls(pack, mode, settings.k, runner.device, sender, runner.model_config.get_vocab_size(),
                   settings.hidden, settings.audit_k)

    def after_forward(self, runner: Any) -> None:
        """Called between execute_model (forward done, state stashed) and sample_tokens."""
        import torch

        state = runner.execute_model_state
        if state is None:
            return
        n = runner.input_batch.num_reqs
        keep = ~runner.discard_request_mask.np[:n]
        if not keep.any():
            return
        prompt = runner.input_batch.num_prompt_tokens[:n]
        positions = runner.optimistic_seq_lens_cpu[:n].numpy() - prompt
        keep &= positions >= 0
        rows = np.flatnonzero(keep)
        if len(rows) == 0:
            return
        with torch.inference_mode():
            scores = self.scores(runner, state, n)
            values, index = self.visible.top(scores)
            if self.hidden is not None:
                hidden_values, hidden_index = self.hidden.top(scores)
                values, index = torch.cat([values, hidden_values], 1), torch.cat([index, hidden_index], 1)
        req_ids = runner.input_batch.req_ids
        keys = [engine_key(req_ids[i]) for i in rows]
        outs = [int(positions[i]) for i in rows]
        self.sender.add(keys, outs, rows, index, values, self.source)

    def scores(self, runner: Any, state: Any, n: int) -> Any:
        import torch

        if self.mode == "final":
            h = state.sample_hidden_states[:n]
        elif self.mode == "aux":
            h = state.aux_hidden_states[0][runner.query_start_loc.gpu[1:n + 1] - 1]
        else:
            logits = state.logits[:n].float()
            chosen = logits[:, self.token_sets].masked_fill(~self.token_mask, float("-inf"))
            return torch.logsumexp(chosen, dim=-1) - torch.logsumexp(logits, dim=-1, keepdim=True)
        return h.float() @ self.directions.T + self.biases

    def close(self) -> None:
        self.sender.close()


def token_set_tensors(pack: LensPack, device: Any, vocab_size: int) -> tuple[Any, Any, Any]:
    """Padded token-id sets [C', m], their mask and the pack index of each of the C' concepts."""
    import torch

    sets = pack.extra.get("token_sets") or {}
    concepts = [i for i, cid in enumerate(pack.concept_ids) if sets.get(cid)]
    width = max(len(sets[pack.concept_ids[i]]) for i in concepts)
    ids = np.zeros((len(concepts), width), dtype=np.int64)
    mask = np.zeros((len(concepts), width), dtype=bool)
    for row, i in enumerate(concepts):
        tokens = [int(t) for t in sets[pack.concept_ids[i]]]
        if any(not 0 <= t < vocab_size for t in tokens):
            raise ValueError(f"lens: token_sets[{pack.concept_ids[i]!r}] has a token id outside the vocabulary")
        ids[row, :len(tokens)], mask[row, :len(tokens)] = tokens, True
    return (torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device),
            torch.tensor(concepts, dtype=torch.int64, device=device))


class _Part:
    """One side of the split (visible or hidden concepts): which score columns it takes and where each
    lands in its own list of concepts (pack order), and how many it keeps."""

    def __init__(self, columns: list[int], members: list[int], k: int, device: Any) -> None:
        import torch

        place = {pack_index: i for i, pack_index in enumerate(members)}
        taken = [(col, place[p]) for col, p in enumerate(columns) if p in place]
        # Every column, each in its own place (no hidden concept, no logit lens): no gather a step.
        self.whole = taken == [(i, i) for i in range(len(columns))]
        self.columns = torch.tensor([c for c, _ in taken], dtype=torch.int64, device=device)
        self.places = torch.tensor([p for _, p in taken], dtype=torch.int64, device=device)
        self.k = min(k, len(taken))

    def top(self, scores: Any) -> tuple[Any, Any]:
        """The top k of this part's columns: (values, each one's index in the part's concepts)."""
        if self.whole:
            values, index = scores.topk(self.k, dim=-1)
            return values, index
        values, index = scores[:, self.columns].topk(self.k, dim=-1)
        return values, self.places[index]
