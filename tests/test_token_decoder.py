"""Token texts decoded in XDB from the ids the recorder ships: the API side's batches carry ids and no
texts, and the stored `content` of every output row is what the server's TokenTexts gives — multi-byte
characters split over tokens and over batch boundaries (every chunk phase), special tokens skipped, and
a batch decoded alone (a fresh decoder, a service restarted between batches)."""

from __future__ import annotations

import copy
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from required import missing

from bench.servers import REAL_MODEL
from server.recording.recorder import Recorder, TokenStream
from server.recording.token_text import TokenTexts
from xdb import XDB, RemoteXDB
from xdb.owner import EVERY
from xdb.rows import DECODE_CONTEXT, TimestepRow, TokenBatch
from xdb.token_decoder import TokenDecoder

TEXT = ("Hello 😀 world, 你好世界! 🎉🎉 naïve café — 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 👨‍👩‍👧 ありがとう 한국어 ") * 3
CHUNK = TokenStream.CHUNK


@pytest.fixture(scope="module", params=["tiny", "smollm2"])
def fast_tokenizer(request: pytest.FixtureRequest, tokenizer: Any) -> Any:
    """The tiny model's byte-level tokenizer (a byte a token past ASCII), and SmolLM2's where pulled."""
    if request.param == "tiny":
        return tokenizer
    if not (REAL_MODEL / "tokenizer.json").exists():
        message = "SmolLM2 is not pulled (make setup runs ahc model pull smollm2-135m)"
        missing(message)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(REAL_MODEL)


def reply_ids(tokenizer: Any) -> list[int]:
    """TEXT's ids with special tokens inside and at the end, as a reply may have them."""
    ids = list(tokenizer.encode(TEXT, add_special_tokens=False))
    special = tokenizer.all_special_ids[0]
    return ids[:40] + [special] + ids[40:] + [special]


def reference(tokenizer: Any, ids: list[int]) -> list[str]:
    texts = TokenTexts(tokenizer)
    return [texts.step(t) for t in ids]


def test_the_texts_split_characters_over_tokens(fast_tokenizer: Any) -> None:
    ids = reply_ids(fast_tokenizer)
    texts = reference(fast_tokenizer, ids)
    assert "".join(texts) == fast_tokenizer.decode(ids, skip_special_tokens=True)
    assert sum(t == "" for t in texts) > 10  # characters held back until their last token: what is tested


def test_a_batch_decodes_alone_at_every_phase(fast_tokenizer: Any) -> None:
    """Each batch by a decoder of its own, as a service restarted before every batch would: the texts of
    the whole reply's DecodeStream, whichever tokens the batch boundaries fall between."""
    ids = reply_ids(fast_tokenizer)
    expected = reference(fast_tokenizer, ids)
    decoder = TokenDecoder.from_str(fast_tokenizer.backend_tokenizer.to_str())  # no state between batches
    for phase in range(CHUNK):
        cuts = [0, *range(CHUNK - phase, len(ids), CHUNK), len(ids)]
        texts: list[str] = []
        for start, stop in zip(cuts, cuts[1:]):
            texts += decoder.texts(ids[start:stop], ids[max(start - DECODE_CONTEXT, 0):start])
        assert texts == expected, f"phase {phase}"


def test_a_slice_of_a_batch_decodes_alone(fast_tokenizer: Any) -> None:
    """What the writer and the service cut a batch into (a batch's size, a resent part's stored rows, the
    activation join's runs) carries the ids before it too."""
    ids = reply_ids(fast_tokenizer)
    expected = reference(fast_tokenizer, ids)
    decoder = TokenDecoder.from_str(fast_tokenizer.backend_tokenizer.to_str())
    batch = TokenBatch("s", range(len(ids)), None, token_ids=ids)
    for start in range(0, len(ids), 5):
        part = batch.slice(start, start + 11)
        assert decoder.texts(part.token_ids or [], part.context_ids) == expected[start:start + 11], start
    twice = batch.slice(10, 60).slice(5, 20)
    assert decoder.texts(twice.token_ids or [], twice.context_ids) == expected[15:30]


def spied(recorder: Recorder, monkeypatch: pytest.MonkeyPatch) -> list[TokenBatch]:
    submitted: list[TokenBatch] = []
    submit = recorder.submit

    def spy(rows: list[TimestepRow] | TokenBatch) -> None:
        assert isinstance(rows, TokenBatch)
        submitted.append(copy.copy(rows))  # as it left: the in-process writer decodes into the batch
        submit(rows)

    monkeypatch.setattr(recorder, "submit", spy)
    return submitted


def test_stored_texts_are_the_token_texts_at_every_phase(
        tmp_path: Path, fast_tokenizer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = reply_ids(fast_tokenizer)
    expected = reference(fast_tokenizer, ids)
    with XDB.open(tmp_path / "x") as xdb:
        recorder = Recorder(xdb, fast_tokenizer)
        submitted = spied(recorder, monkeypatch)
        for phase in range(CHUNK):
            stream = TokenStream(recorder, f"s{phase}", "r", phase=phase)
            for token_id in ids:  # a token an engine step
                stream.add([token_id])
            stream.finish()
        assert xdb.writer is not None
        xdb.writer.flush(30)
        for phase in range(CHUNK):
            rows = xdb.recall(session_id=f"s{phase}", limit=len(ids), owner=EVERY)
            assert [r["token_id"] for r in rows] == ids
            assert [r["content"] for r in rows] == expected, f"phase {phase}"
    # What left the API side: ids, the reply's ids before each batch, and no texts.
    assert submitted and all(b.contents is None for b in submitted)
    first = [b for b in submitted if b.session_id == "s5"]
    sent = [t for b in first for t in b.token_ids or ()]
    assert sent == ids
    offset = 0
    for b in first:
        assert list(b.context_ids) == ids[max(offset - DECODE_CONTEXT, 0):offset]
        offset += len(b)


class SlowTokenizer:
    """A tokenizer without a fast one behind it (no `backend_tokenizer`): texts are made by the recorder."""

    def __init__(self, fast: Any) -> None:
        self._fast = fast

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return str(self._fast.decode(ids, skip_special_tokens=skip_special_tokens))


def test_a_slow_tokenizer_has_its_texts_made_by_the_recorder(
        tmp_path: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = reply_ids(tokenizer)
    slow = SlowTokenizer(tokenizer)
    with XDB.open(tmp_path / "x") as xdb:
        recorder = Recorder(xdb, slow)  # type: ignore[arg-type]  # duck-typed, as vLLM's protocol is
        submitted = spied(recorder, monkeypatch)
        stream = recorder.token_stream("s", "r")
        for token_id in ids:
            stream.add([token_id])
        stream.finish()
        assert xdb.writer is not None
        xdb.writer.flush(30)
        rows = xdb.recall(session_id="s", limit=len(ids), owner=EVERY)
    assert all(b.contents is not None for b in submitted)
    assert "".join(r["content"] for r in rows) == tokenizer.decode(ids, skip_special_tokens=True)


def test_a_writer_without_a_tokenizer_refuses_ids_alone(tmp_path: Path) -> None:
    with XDB.open(tmp_path / "x") as xdb:
        assert xdb.writer is not None
        with pytest.raises(ValueError, match="decodes"):
            xdb.writer.submit(TokenBatch("s", xdb.next_ticks("s", 2), None, token_ids=[1, 2]))
        with pytest.raises(ValueError, match="contents, or token_ids"):
            xdb.writer.submit(TokenBatch("s", xdb.next_ticks("s", 2), None))


@pytest.mark.process
def test_the_service_decodes_and_a_restarted_one_needs_no_state(tmp_path: Path, tokenizer: Any) -> None:
    """Ids shipped to the service; it is killed between two batches of a reply, and the one started in
    its place decodes the next batch (and any held one) with the tokenizer the writer tells it again;
    a vacuum, which reopens XDB in the service, keeps it too."""
    ids = reply_ids(tokenizer)
    expected = reference(tokenizer, ids)
    held = [i for i in range(len(ids)) if expected[i] == ""]  # cuts inside characters
    cuts = [0, held[len(held) // 3], held[2 * len(held) // 3], len(ids)]
    with RemoteXDB(tmp_path / "x") as xdb:
        xdb.decode_tokens_with(tokenizer.backend_tokenizer.to_str())
        for n, (start, stop) in enumerate(zip(cuts, cuts[1:])):
            if n == 1:
                pid = xdb.writer.process.process.pid
                assert pid is not None
                os.kill(pid, signal.SIGKILL)
            if n == 2:
                xdb.vacuum()
            xdb.writer.submit(TokenBatch("s", xdb.next_ticks("s", stop - start), None, token_ids=ids[start:stop],
                                         context_ids=ids[max(start - DECODE_CONTEXT, 0):start]))
            xdb.writer.flush(60)
        assert xdb.writer.restarts == 1
        rows = xdb.recall(session_id="s", limit=len(ids), owner=EVERY)
    assert [r["content"] for r in rows] == expected
