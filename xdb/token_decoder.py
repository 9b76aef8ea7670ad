"""Generated tokens' texts, decoded where the rows are built — the writer's prepare stage, in the XDB
service when the server runs one — so the process that streams tokens ships their ids alone.

A token's text is what the tokenizers library's DecodeStream gives stepping through the whole reply
(the server's TokenTexts): a reply's texts concatenate to its text, a multi-byte character split over
tokens comes with the token that completes it, special tokens are empty. A batch decodes on its own,
so a restarted service needs no state per reply: a fresh DecodeStream is stepped through the ids the
reply had just before the batch (`TokenBatch.context_ids`), then through the batch's own. Once it has
released a character among those ids it holds back exactly what the reply's own stream holds back (a
character is at most four byte tokens; DECODE_CONTEXT ids leave room for one to complete), and gives
the same texts from there on. Only a reply whose last DECODE_CONTEXT ids before a batch completed no
character at all (invalid UTF-8 from the model, half a character before a run of special tokens) may
show a U+FFFD more with the batch's first text.

Stepping a DecodeStream is one call into Rust a token (~1 µs with the context, measured by
`python -m bench.token_decode`); a decode_batch of every prefix would be one call but quadratic work.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from xdb.rows import TimestepRow, TokenBatch

log = logging.getLogger(__name__)

Part = list[TimestepRow] | TokenBatch


@dataclass(frozen=True)
class TokenDecoder:
    tokenizer: Tokenizer

    @classmethod
    def from_str(cls, serialized: str) -> TokenDecoder:
        """From a fast tokenizer's serialized form (`backend_tokenizer.to_str()`)."""
        return cls(Tokenizer.from_str(serialized))

    def texts(self, ids: Sequence[int] | np.ndarray, context: Sequence[int] = ()) -> list[str]:
        """Each of `ids`' own text, the reply's `context` ids (those just before them) decoded first."""
        stream = DecodeStream(skip_special_tokens=True)
        step, tokenizer = stream.step, self.tokenizer
        for token_id in context:
            step(tokenizer, token_id)
        return [step(tokenizer, token_id) or "" for token_id in _ints(ids)]

    def fill(self, parts: list[Part]) -> None:
        """Give every TokenBatch that came with token ids alone its texts."""
        for part in parts:
            if isinstance(part, TokenBatch) and part.contents is None:
                assert part.token_ids is not None  # TokenBatch.check: ids where texts are not given
                part.contents = self.texts(part.token_ids, part.context_ids)


def _ints(ids: Sequence[int] | np.ndarray) -> Sequence[int]:
    """Python ints: DecodeStream takes numpy's too, at a conversion each."""
    return ids.tolist() if isinstance(ids, np.ndarray) else ids
