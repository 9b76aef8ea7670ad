"""`ahc bench quality`'s generated Codex and load, engine-free: the same seed gives the same Codex, every
answer is in it exactly once (in the document its question names), and no answer can be mistaken for
another; and the bench itself at its smoke load on the real-model tier's server."""

from __future__ import annotations

import pytest
from bench_smoke import SMOKES, run_bench

from bench.quality import LOADS, QualityLoad, check_report, context_for
from bench.quality_codex import MAX_QUESTIONS, generate


def test_the_same_seed_gives_the_same_codex_and_another_seed_another() -> None:
    assert generate(12, 3, 4, seed=7) == generate(12, 3, 4, seed=7)
    assert generate(12, 3, 4, seed=7) != generate(12, 3, 4, seed=8)


@pytest.mark.parametrize(("questions", "documents", "filler"), [(24, 4, 6), (3, 1, 0), (MAX_QUESTIONS, 7, 3)])
def test_every_answer_is_in_the_codex_once_in_its_own_document(questions: int, documents: int, filler: int) -> None:
    codex = generate(questions, documents, filler)
    assert len(codex.questions) == questions
    assert [doc["id"] for doc in codex.documents] == [f"record-{i + 1}" for i in range(documents)]
    texts = {doc["id"]: doc["text"].lower() for doc in codex.documents}
    whole = "\n\n".join(texts.values())
    for question in codex.questions:
        answer = question.answer.lower()
        assert whole.count(answer) == 1, question
        assert answer in texts[question.document], question
        assert answer not in question.text.lower()


def test_answers_and_questions_are_distinct_and_no_answer_is_part_of_another() -> None:
    codex = generate(MAX_QUESTIONS, 4, 1)
    answers = [q.answer.lower() for q in codex.questions]
    assert len(set(answers)) == len(answers)
    assert len({q.text for q in codex.questions}) == len(answers)
    assert not [(a, b) for a in answers for b in answers if a != b and a in b]


def test_the_default_codex_is_a_few_thousand_tokens_and_spread_over_its_documents() -> None:
    codex = generate()
    words = sum(len(doc["text"].split()) for doc in codex.documents)
    assert 1500 < words < 4000  # ~3k tokens with SmolLM2's tokenizer: CAG fits the 8k window
    assert {q.document for q in codex.questions} == {doc["id"] for doc in codex.documents}


def test_sizes_out_of_range_are_refused() -> None:
    for args in [(0, 1, 1), (MAX_QUESTIONS + 1, 1, 1), (3, 4, 1), (3, 1, -1)]:
        with pytest.raises(ValueError):
            generate(*args)


def test_the_load_comes_from_its_environment_variable() -> None:
    load = LOADS.parse("questions=3,documents=1,base_url=http://127.0.0.1:8000")
    assert load == QualityLoad(questions=3, documents=1, base_url="http://127.0.0.1:8000")
    with pytest.raises(ValueError, match=LOADS.env):
        LOADS.parse("turns=3")


def test_each_mode_sends_its_context_and_a_report_of_another_prompt_is_an_error() -> None:
    refs = [{"document": "doc-1", "id": "record-1"}]
    assert "codex" not in context_for("none", refs, None)
    assert context_for("rag", refs, None)["mode"] == "rag"
    assert context_for("condensed", refs, 0.25) == {"identity": context_for("none", refs, None)["identity"],
                                                    "codex": refs, "mode": "auto", "cag_threshold": 0.25}
    condensed: dict[str, str | None] = {"record-1": "short", "record-2": None}
    good = {"mode": "cag", "codex": [{"id": "record-1", "rendition": "condensed"},
                                     {"id": "record-2", "rendition": "full"}]}
    check_report("condensed", good, condensed)
    with pytest.raises(RuntimeError, match="not the one asked for"):
        check_report("cag", good, condensed)
    with pytest.raises(RuntimeError, match="not the one asked for"):
        check_report("condensed", {**good, "mode": "rag"}, condensed)


@pytest.mark.real_model
@pytest.mark.slow
def test_the_quality_bench_runs_on_the_real_model_server(real_server) -> None:  # type: ignore[no-untyped-def]
    """The smoke run, on the real-model tier's own server (one real-model engine per test session)."""
    server = f"base_url={real_server.base_url},api_key={real_server.api_key}"
    load = f"{SMOKES['quality'].env['BENCH_QUALITY_LOAD']},{server}"
    result = run_bench("quality", env={"BENCH_QUALITY_LOAD": load})
    assert 0 <= result["figures"]["accuracy_cag"] <= 1
