"""Deterministic chunking of Codex documents for RAG.

A chunk is always an exact slice of its document (`text == doc[start_char:end_char]`), so a retrieved
chunk can be traced back to its place and two runs over the same text give byte-identical chunks.
Chunks end on the strongest boundary available: a paragraph, else a line, a sentence, a word, and only
for a run of text with no whitespace at all, a character.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass

CountTokens = Callable[[str], int]

# Separators from strongest to weakest; a piece too long at one level is split at the next.
_SEPARATORS: tuple[re.Pattern[str], ...] = (
    re.compile(r"\n[ \t\r\f\v]*\n\s*"),  # paragraph: a blank line
    re.compile(r"\n\s*"),  # line (lists, code, tables)
    # sentence: after . ! ? or ; (and a closing quote or bracket); separators are whitespace only,
    # so text between two units is never lost at a chunk boundary
    re.compile(r"(?:(?<=[.!?;])|(?<=[.!?;][\"')\]]))\s+"),
    re.compile(r"\s+"),  # word
)
_WORD = 3  # pieces reaching this level are sentences (or lines): the smallest natural units
_CHARACTER = len(_SEPARATORS)  # boundary strength of a cut inside a word
_AIM = 0.9  # a cut inside a word aims at this share of max_tokens (token density varies along a blob)


@dataclass(frozen=True)
class Chunk:
    """`start_char`/`end_char` index the document as a Python str (code points, not bytes)."""

    doc_id: str
    chunk_index: int
    text: str
    start_char: int
    end_char: int
    sha256: str  # of `text`: the key under which its embedding is reused


@dataclass(frozen=True)
class _Unit:
    """A piece of the document that fits in one chunk, and how strong the boundary before it is
    (0 = paragraph ... 4 = inside a word): the packer prefers to cut before strong boundaries."""

    start: int
    end: int
    tokens: int
    boundary: int


def approx_token_count(text: str) -> int:
    """A tokenizer-free estimate (~4 characters a token) for callers without a tokenizer."""
    return (len(text) + 3) // 4


def chunk_document(doc_id: str, text: str, max_tokens: int = 200, overlap: int = 40,
                   count_tokens: CountTokens = approx_token_count) -> list[Chunk]:
    """Split `text` into chunks of at most ~`max_tokens` tokens; consecutive chunks share up to
    `overlap` tokens of whole units so a fact cut at a boundary is still whole in one of them.

    Token counts of a chunk are the sum of its units' counts: exact for WordPiece (the embedder's
    tokenizer splits on whitespace first), an estimate for other tokenizers."""
    if max_tokens < 1 or not 0 <= overlap < max_tokens:
        raise ValueError(f"need max_tokens >= 1 and 0 <= overlap < max_tokens, got {max_tokens}, {overlap}")
    units = _split(text, 0, len(text), 0, 0, max_tokens, count_tokens)
    chunks: list[Chunk] = []
    for first, last in _pack(units, max_tokens, overlap):
        start, end = units[first].start, units[last - 1].end
        body = text[start:end]
        chunks.append(Chunk(doc_id, len(chunks), body, start, end,
                            hashlib.sha256(body.encode("utf-8")).hexdigest()))
    return chunks


def _split(text: str, start: int, end: int, level: int, boundary: int, max_tokens: int,
           count_tokens: CountTokens) -> list[_Unit]:
    """The units of text[start:end], whitespace trimmed: its sentences (or lines), each split finer
    (words, then characters) only when it alone exceeds max_tokens."""
    start, end = _trim(text, start, end)
    if start >= end:
        return []
    if level < _WORD:
        # Always down to sentences, fitting or not: units that small let chunks end on the best
        # boundary and let the overlap carry the last sentences instead of a whole paragraph.
        return _split_at(text, start, end, level, boundary, max_tokens, count_tokens)
    tokens = count_tokens(text[start:end])
    if tokens <= max_tokens:
        return [_Unit(start, end, tokens, boundary)]
    if level == _CHARACTER or _SEPARATORS[level].search(text, start, end) is None:
        # No whitespace inside: the next level would see this same span and count it again.
        return _split_characters(text, start, end, boundary, max_tokens, count_tokens, tokens)
    return _split_at(text, start, end, level, boundary, max_tokens, count_tokens)


def _split_at(text: str, start: int, end: int, level: int, boundary: int, max_tokens: int,
              count_tokens: CountTokens) -> list[_Unit]:
    """Split at this level's separators and hand each piece to the next level."""
    units: list[_Unit] = []
    piece_start = start
    pieces = [(m.start(), m.end()) for m in _SEPARATORS[level].finditer(text, start, end)]
    for n, (sep_start, sep_end) in enumerate(pieces + [(end, end)]):
        # The first piece keeps the boundary the caller saw before this span; later ones are cut here.
        before = boundary if n == 0 else level
        units += _split(text, piece_start, sep_start, level + 1, before, max_tokens, count_tokens)
        piece_start = sep_end
    return units


def _split_characters(text: str, start: int, end: int, boundary: int, max_tokens: int,
                      count_tokens: CountTokens, tokens: int) -> list[_Unit]:
    """A run with no whitespace (a blob, a URL) of `tokens` tokens: cut it into pieces that fit.

    Each piece is measured on a window the size the run's density predicts, never on the rest of the
    run: counting the remainder before every cut tokenized ~n²/(2 × piece) characters, minutes of CPU
    for a blob of a few MB. Here every window is about one piece long, so the work is linear."""
    units: list[_Unit] = []
    chars_per_token = (end - start) / max(tokens, 1)
    longest = end - start
    while start < end:
        # Aim a little under the limit so the first window usually fits; never more than twice the
        # last piece, so a sparse stretch (an [UNK] run is one token) cannot make one window huge.
        length = min(end - start, longest, max(1, int(max_tokens * _AIM * chars_per_token)))
        tokens = count_tokens(text[start:start + length])
        while tokens > max_tokens and length > 1:
            # Shrink in proportion to the overshoot, then by 10 % at least, so this ends quickly.
            length = max(1, min(length * max_tokens // tokens, length - max(1, length // 10)))
            tokens = count_tokens(text[start:start + length])
        units.append(_Unit(start, start + length, tokens, boundary if not units else _CHARACTER))
        start += length
        chars_per_token, longest = length / max(tokens, 1), 2 * length
    return units


def _trim(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def _pack(units: list[_Unit], max_tokens: int, overlap: int) -> list[tuple[int, int]]:
    """Greedy packing of units into [first, last) ranges, cutting before the strongest boundary in the
    second half of a full chunk, and starting each chunk with up to `overlap` tokens of the last."""
    ranges: list[tuple[int, int]] = []
    first = 0
    while first < len(units):
        last, total = first, 0
        while last < len(units) and total + units[last].tokens <= max_tokens:
            total += units[last].tokens
            last += 1
        last = max(last, first + 1)  # a unit always fits alone (splitting guarantees it)
        if last < len(units):
            last = _best_cut(units, first, last, max_tokens)
        ranges.append((first, last))
        if last == len(units):
            break
        first = _overlap_start(units, first, last, max_tokens, overlap)
    return ranges


def _best_cut(units: list[_Unit], first: int, last: int, max_tokens: int) -> int:
    """The cut in (first, last] before the strongest boundary that keeps the chunk at least half full;
    among equally strong ones the latest, so chunks stay as full as the boundaries allow."""
    best, best_key, total = last, (units[last].boundary, -last), 0
    for cut in range(first + 1, last):
        total += units[cut - 1].tokens
        key = (units[cut].boundary, -cut)
        if total * 2 >= max_tokens and key < best_key:
            best, best_key = cut, key
    return best


def _overlap_start(units: list[_Unit], first: int, last: int, max_tokens: int, overlap: int) -> int:
    """The first unit of the next chunk: back from `last` while the overlap stays within `overlap`
    tokens and leaves room for the next new unit; always after `first` so packing advances."""
    start, carried = last, 0
    room = max_tokens - units[last].tokens
    while start - 1 > first and carried + units[start - 1].tokens <= min(overlap, room):
        start -= 1
        carried += units[start].tokens
    return start
