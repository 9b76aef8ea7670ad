"""Token counts of very long texts in a child process, so that tokenizing a 20 MB Codex does not stall
the event loop.

The tokenizer's Rust core releases the GIL while it encodes, but the Python objects of its result (the
list of ids, or the `Encoding` with one string per token) are built and freed holding it: for a 20 MB
Codex (16M tokens with the tiny model) that is 0.5 to 2.5 s in which no other thread of the server
runs, /health included. A child process counts such texts instead and sends back one integer.

Only for a Hugging Face fast tokenizer (its encoding is the `tokenizers` library's), and only when a
copy of it counts as the tokenizer itself does on a few probes; otherwise every count stays in-process.
The child starts with the first text long enough to need it.
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

log = logging.getLogger(__name__)

# Below this a text's tokens hold the GIL for well under 50 ms in-process, less than the hand-off to
# the child is worth (a 0.7 MB text: about 60 ms with the tiny model's tokenizer).
APART_CHARS = 256 << 10

_PROBES = ("Hello, world! It's 2024.", "  two spaces\n\n\ttab\r\nend  ", "ünïcödé 日本語 🙂 café",
           "w1 w2 w3 " * 20, "def f(x):\n    return x ** 2  # square\n")


class TokenProcess:
    """`count(text)` is `len(encode(text))`, counted in a child process for a text of `min_chars` or
    more. Blocking: called from worker threads (`TokenCounter.prefetch`); one count at a time."""

    def __init__(self, tokenizer_json: str, split_special_tokens: bool, encode: Callable[[str], list[int]],
                 min_chars: int = APART_CHARS) -> None:
        self._spec = (tokenizer_json, split_special_tokens)
        self._encode = encode
        self.min_chars = min_chars
        self._lock = threading.Lock()
        self._process: BaseProcess | None = None
        self._conn: Connection | None = None
        self._closed = False
        self.counted = 0  # texts the child counted

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, encode: Callable[[str], list[int]],
                      min_chars: int = APART_CHARS) -> TokenProcess | None:
        """A TokenProcess for a tokenizer whose `tokenizers` copy counts as `encode` does; else None."""
        try:
            from tokenizers import Tokenizer
        except ImportError:
            return None
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if not isinstance(backend, Tokenizer):
            return None
        spec = (backend.to_str(), bool(getattr(tokenizer, "split_special_tokens", False)))
        local = _tokenizer(*spec)
        specials = "".join(str(t) for t in getattr(tokenizer, "all_special_tokens", ()))
        for probe in (*_PROBES, f"{specials}x{specials}"):
            if _count(local, probe) != len(encode(probe)):
                log.info("long texts are tokenized in-process: a copy of the tokenizer counts %r differently",
                         probe)
                return None
        return cls(*spec, encode, min_chars)

    def count(self, text: str) -> int:
        if len(text) < self.min_chars:
            return len(self._encode(text))
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates: the tokenizer itself says what becomes of them
            return len(self._encode(text))
        with self._lock:
            if self._closed:
                raise RuntimeError("the token counting process is closed")
            try:
                conn = self._connect()
                conn.send_bytes(data)
                reply = conn.recv()
            except Exception as exc:  # the child died (killed for memory?) or never started
                if self._closed:
                    raise RuntimeError("the token counting process is closed") from None
                log.warning("the token counting process failed (%r): this text is counted in-process", exc)
                self._stop()
                reply = None
        if isinstance(reply, int):
            self.counted += 1
            return reply
        return len(self._encode(text))  # the child could not count it: the tokenizer's own answer or error

    def close(self) -> None:
        """Stop the child; a count under way ends with an error rather than hold up shutdown."""
        self._closed = True
        process = self._process
        if process is not None:
            process.terminate()  # a count under way sees its pipe close, and gives up the lock
        with self._lock:
            self._stop()

    def _connect(self) -> Connection:
        if self._conn is None or self._process is None or not self._process.is_alive():
            self._stop()
            # Spawned, not forked: the server's threads (and vLLM's) must not be copied mid-flight.
            context = multiprocessing.get_context("spawn")
            ours, theirs = context.Pipe()
            process = context.Process(target=_serve, args=(theirs, *self._spec), name="ahc-token-count",
                                      daemon=True)
            process.start()
            theirs.close()
            self._process, self._conn = process, ours
        return self._conn

    def _stop(self) -> None:
        process, conn = self._process, self._conn
        self._process = self._conn = None
        if process is not None and process.is_alive():
            process.terminate()
            process.join(5)
        if conn is not None:
            conn.close()


def _tokenizer(tokenizer_json: str, split_special_tokens: bool) -> Any:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(tokenizer_json)
    # As the Hugging Face tokenizer sets it for a plain `encode(text, add_special_tokens=False)`.
    tokenizer.no_truncation()
    tokenizer.no_padding()
    tokenizer.encode_special_tokens = split_special_tokens
    return tokenizer


def _count(tokenizer: Any, text: str) -> int:
    return len(tokenizer.encode_batch([text], add_special_tokens=False)[0])


def _serve(conn: Connection, tokenizer_json: str, split_special_tokens: bool) -> None:
    """The child: UTF-8 texts in, token counts (or None: could not count) out, until the pipe closes."""
    tokenizer = _tokenizer(tokenizer_json, split_special_tokens)
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):  # the server is gone
            return
        try:
            reply: int | None = _count(tokenizer, data.decode("utf-8"))
        except Exception:
            reply = None
        conn.send(reply)
