"""Very long texts counted in a child process: the same counts as the tokenizer in-process, and the
server goes on counting (in-process) when the child cannot."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from server.model.token_process import TokenProcess


@pytest.fixture
def encode(tokenizer) -> Callable[[str], list[int]]:  # type: ignore[no-untyped-def]
    return lambda text: tokenizer.encode(text, add_special_tokens=False)


@pytest.fixture
def process(tokenizer, encode: Callable[[str], list[int]]) -> Iterator[TokenProcess]:  # type: ignore[no-untyped-def]
    counter = TokenProcess.for_tokenizer(tokenizer, encode, min_chars=1000)
    assert counter is not None  # the tiny model's is a Hugging Face fast tokenizer
    yield counter
    counter.close()


@pytest.mark.process
def test_a_long_text_is_counted_apart_exactly_as_in_process(tokenizer, encode: Callable[[str], list[int]],  # type: ignore[no-untyped-def]
                                                            process: TokenProcess) -> None:
    specials = "".join(tokenizer.all_special_tokens)
    text = f"{specials} ünïcödé 日本語 🙂\n\n\tw1  w2 " * 200
    assert process.count(text) == len(encode(text)) and process.counted == 1
    assert process.count("short") == len(encode("short")) and process.counted == 1  # in-process
    assert process.count(text.upper()) == len(encode(text.upper())) and process.counted == 2  # the same child


class _BrokenPipe:
    def send_bytes(self, data: bytes) -> None:
        raise BrokenPipeError("the child is gone")

    def close(self) -> None:
        pass


@pytest.mark.process
def test_a_failed_child_costs_one_in_process_count_then_is_replaced(encode: Callable[[str], list[int]],
                                                                    process: TokenProcess) -> None:
    text = "w1 w2 w3 " * 500
    assert process.count(text) == len(encode(text)) and process.counted == 1
    first = process._process
    assert first is not None
    process._conn = _BrokenPipe()  # type: ignore[assignment]
    assert process.count(text) == len(encode(text)) and process.counted == 1  # counted in-process
    assert not first.is_alive()
    assert process.count(text) == len(encode(text)) and process.counted == 2  # by a new child
    process._process.kill()  # type: ignore[union-attr]
    process._process.join()  # type: ignore[union-attr]
    assert process.count(text) == len(encode(text)) and process.counted == 3  # a dead one is replaced first
    process.close()
    with pytest.raises(RuntimeError, match="closed"):
        process.count(text)
    assert process.count("short") == len(encode("short"))


def test_only_a_tokenizer_whose_copy_counts_the_same_is_counted_apart(tokenizer) -> None:  # type: ignore[no-untyped-def]
    assert TokenProcess.for_tokenizer(object(), lambda text: [0] * len(text)) is None  # not a fast tokenizer
    assert TokenProcess.for_tokenizer(tokenizer, lambda text: [0] * len(text.split())) is None  # counts differ
