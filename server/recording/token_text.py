"""Each generated token's own text, such that a reply's token texts concatenate to the reply.

Byte-level BPE splits multi-byte characters over tokens; the tokenizers library's DecodeStream holds
the partial bytes back and releases the character with the token that completes it.

The recorder makes texts here only for a slow tokenizer: a fast one's are decoded in XDB from the
token ids (xdb/token_decoder.py), to the same texts as this stream gives.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # vLLM is imported when the engine starts, not with this module
    from tokenizers import Tokenizer
    from vllm.tokenizers.protocol import TokenizerLike



class TokenTexts:
    def __init__(self, tokenizer: TokenizerLike) -> None:
        self._backend: Tokenizer | None = getattr(tokenizer, "backend_tokenizer", None)
        self._tokenizer = tokenizer
        self._stream = None
        self._ids: list[int] = []
        self._text = ""
        if self._backend is not None:
            from tokenizers.decoders import DecodeStream

            self._stream = DecodeStream(skip_special_tokens=True)

    def step(self, token_id: int) -> str:
        if self._stream is not None and self._backend is not None:  # set together
            return self._stream.step(self._backend, token_id) or ""
        # Slow tokenizers: decode the whole prefix and emit what grew (quadratic, but rare).
        self._ids.append(token_id)
        text = self._tokenizer.decode(self._ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return ""
        new, self._text = text[len(self._text):], text
        return new
