"""`ahc bench quality`: does the orchestrator keep answers right? The same questions asked with no Codex,
with the Codex in the prompt (CAG), retrieved from it (RAG), and in its condensed rendition.

The Codex is generated (bench/quality_codex.py): facts planted in filler text, ~3k tokens at the default
load, each question with one exact answer; a reply is right when it contains its answer (case aside).
One `ahc serve` of the real model (SmolLM2-135M-Instruct, config cpu-small, lens off), started here, or
a running server (`base_url`). The Codex documents are uploaded to XDB once and named by reference;
the served model makes each one's condensed rendition first (`POST /v1/xdb/documents/{id}/condensed`,
as an operator would ahead of time), so the condensed figures are what this model's condensation costs.

Every question in every mode is an independent request (no `session_id`: no State, so no earlier
answer is in the prompt), temperature 0, in the same seeded order; the prefix cache is shared across
them as it is across an agent's turns, since the Identity and Codex blocks come first, unchanged.
  none       `context` with the Identity and no Codex: what the model guesses.
  cag        `"mode": "cag"`: the whole Codex in the prompt, full text.
  rag        `"mode": "rag"`: excerpts retrieved for the question in the Query block, and the
             `query_archive` tool; a call to it is run (`POST /v1/context/query_archive`) and its
             result sent back, as a client does (at most `tool_rounds` times; tokens summed).
  condensed  `"mode": "auto"` with the request's `cag_threshold` just under the full Codex's tokens:
             the placement auto mode takes for a Codex just over its threshold whose documents have
             renditions (the API has no mode that forces it). Every reply's report is checked.
Figures: accuracy per mode, mean prompt and cached tokens per question per mode, mean seconds per
question, the Codex's tokens full and condensed, the share of answers the renditions kept.

The load is `LOADS` (bench/load.py): `BENCH_QUALITY_LOAD="smoke"` or e.g. `"questions=3,documents=1,filler=2"`:
`questions` (kinds in turn: access codes, names, passwords), `documents`, `filler` sentences per fact,
`seed`, `max_tokens` per reply, `tool_rounds`, `base_url` (e.g. http://127.0.0.1:8000: that server
instead of one started here; `api_key` its key).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai

from bench.device import engine_device
from bench.load import DEFAULT, SMOKE, Loads
from bench.quality_codex import QualityCodex, Question, generate
from bench.result import BenchResult
from bench.servers import REAL_CONFIG, REAL_MODEL, start_server

MODES = ("none", "cag", "rag", "condensed")
IDENTITY = "You answer questions about the town records. Reply with the answer only: a number, a name or a word."


@dataclass(frozen=True)
class QualityLoad:
    questions: int = 24
    documents: int = 4
    filler: int = 6
    seed: int = 0
    max_tokens: int = 24
    tool_rounds: int = 2
    base_url: str = ""
    api_key: str = ""

    def __post_init__(self) -> None:
        if self.max_tokens < 1 or self.tool_rounds < 0:
            raise ValueError("max_tokens must be at least 1, tool_rounds at least 0")


LOADS = Loads("quality", {DEFAULT: QualityLoad(), SMOKE: QualityLoad(questions=3, documents=1, filler=6)})


@dataclass
class ModeLog:
    """Per question: right or not, prompt and cached tokens (summed over its requests), seconds."""

    right: list[bool] = field(default_factory=list)
    prompt: list[int] = field(default_factory=list)
    cached: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    tool_calls: int = 0
    replies: list[str] = field(default_factory=list)

    def figures(self, mode: str) -> dict[str, float]:
        return {f"accuracy_{mode}": sum(self.right) / len(self.right),
                f"prompt_tokens_{mode}": statistics.fmean(self.prompt),
                f"cached_tokens_{mode}": statistics.fmean(self.cached),
                f"seconds_per_question_{mode}": statistics.fmean(self.seconds)}


@dataclass
class Target:
    """The server the questions go to."""

    client: openai.OpenAI
    http: httpx.Client
    model: str
    max_model_len: int


@contextmanager
def target(load: QualityLoad) -> Iterator[Target]:
    """The server named by `load.base_url`, else one of the real model started for this run."""
    with tempfile.TemporaryDirectory() as tmp:
        server = None
        if load.base_url:
            base_url, api_key = load.base_url.rstrip("/"), load.api_key or None
        else:
            if not (REAL_MODEL / "config.json").exists():
                raise RuntimeError("the real model is missing: run `make setup` (ahc model pull smollm2-135m)")
            server = start_server(Path(tmp) / "xdb", model=REAL_MODEL, config=REAL_CONFIG, lens="off")
            base_url, api_key = server.base_url, None
        try:
            headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
            with httpx.Client(base_url=base_url, headers=headers, timeout=1800) as http:
                client = openai.OpenAI(base_url=f"{base_url}/v1", api_key=api_key or "none", max_retries=0,
                                       timeout=600)
                card = client.models.list().data[0]
                yield Target(client, http, card.id, int(card.model_dump()["max_model_len"]))
        finally:
            if server is not None:
                server.stop()


def upload(t: Target, codex: QualityCodex) -> list[dict[str, Any]]:
    """Each document stored in XDB once; the Codex entries naming them (by id, under their own ids)."""
    refs = []
    for doc in codex.documents:
        made = t.http.post("/v1/xdb/documents", json={"name": f"bench-quality-{doc['id']}", "content": doc["text"]})
        made.raise_for_status()
        refs.append({"document": made.json()["id"], "id": doc["id"]})
    return refs


def condense(t: Target, refs: list[dict[str, Any]]) -> dict[str, str | None]:
    """Each document's rendition, made by the served model (all at once: the engine batches them);
    None where the model's text was no shorter than the document (nothing stored)."""
    def one(ref: dict[str, Any]) -> str | None:
        made = t.http.post(f"/v1/xdb/documents/{ref['document']}/condensed")
        if made.status_code == 409:
            return None
        made.raise_for_status()
        return str(made.json()["content"])

    with ThreadPoolExecutor(len(refs)) as pool:
        return dict(zip((ref["id"] for ref in refs), pool.map(one, refs), strict=True))


def context_for(mode: str, refs: list[dict[str, Any]], threshold: float | None) -> dict[str, Any]:
    if mode == "none":
        return {"identity": IDENTITY}
    if mode == "condensed":
        return {"identity": IDENTITY, "codex": refs, "mode": "auto", "cag_threshold": threshold}
    return {"identity": IDENTITY, "codex": refs, "mode": mode}


def check_report(mode: str, report: dict[str, Any], condensed: dict[str, str | None]) -> None:
    """The prompt was the one the mode names: the Codex where it should be, in the right rendition."""
    renditions = {entry["id"]: entry["rendition"] for entry in report.get("codex", [])}
    expected = {"none": {},
                "cag": {doc: "full" for doc in condensed},
                "rag": {doc: "excerpts" for doc in condensed},
                "condensed": {doc: "condensed" if text is not None else "full" for doc, text in condensed.items()}}
    want_mode = "rag" if mode == "rag" else "cag"
    if (mode != "none" and report["mode"] != want_mode) or renditions != expected[mode]:
        raise RuntimeError(f"mode {mode}: the prompt was not the one asked for: mode {report['mode']}, "
                           f"renditions {renditions}")


def ask(t: Target, question: Question, mode: str, context: dict[str, Any], load: QualityLoad,
        condensed: dict[str, str | None], log: ModeLog) -> dict[str, Any]:
    """One question; in RAG, a `query_archive` call is run and its result sent back. Returns the
    first reply's cache report."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": question.text}]
    prompt = cached = 0
    start = time.perf_counter()
    for round_ in range(load.tool_rounds + 1):
        reply = t.client.chat.completions.create(model=t.model, messages=messages,
                                                 temperature=0, max_tokens=load.max_tokens,
                                                 extra_body={"context": context})
        if round_ == 0:
            report: dict[str, Any] = reply.to_dict()["context"]
            check_report(mode, report, condensed)
        usage = reply.usage
        assert usage is not None
        prompt += usage.prompt_tokens
        details = usage.prompt_tokens_details
        cached += (details.cached_tokens or 0) if details is not None else 0
        message = reply.choices[0].message
        calls = [c for c in message.tool_calls or [] if c.type == "function" and c.function.name == "query_archive"]
        if not calls or round_ == load.tool_rounds:
            break
        log.tool_calls += len(calls)
        messages.append(message.model_dump(exclude_none=True))
        for call in calls:
            try:
                arguments = json.loads(call.function.arguments or "{}")
            except json.JSONDecodeError:
                arguments = {}
            found = t.http.post("/v1/context/query_archive",
                                json={k: v for k, v in arguments.items() if k in ("query", "k")} or
                                {"query": question.text})
            result = found.json() if found.status_code == 200 else {"error": found.text}
            messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})
    text = message.content or ""
    log.right.append(question.answer.lower() in text.lower())
    log.prompt.append(prompt)
    log.cached.append(cached)
    log.seconds.append(time.perf_counter() - start)
    log.replies.append(text)
    return report


def run(load: QualityLoad) -> BenchResult:
    codex = generate(load.questions, load.documents, load.filler, load.seed)
    logs = {mode: ModeLog() for mode in MODES}
    with target(load) as t:
        refs = upload(t, codex)
        start = time.perf_counter()
        condensed = condense(t, refs)
        condense_s = time.perf_counter() - start
        if all(text is None for text in condensed.values()):
            raise RuntimeError("the served model made no condensed rendition shorter than its document")
        codex_tokens: dict[str, int] = {}
        threshold: float | None = None
        for mode in MODES:
            if mode == "condensed":
                # Auto mode keeps the full Codex only under the threshold: half a token under it, the
                # full Codex is over and its condensed rendition (at most 30% of it) under.
                threshold = (codex_tokens["cag"] - 0.5) / t.max_model_len
            for question in codex.questions:
                report = ask(t, question, mode, context_for(mode, refs, threshold), load, condensed, logs[mode])
                codex_tokens[mode] = next(b["tokens"] for b in report["blocks"] if b["name"] == "codex")
    kept = [q for q in codex.questions if condensed[q.document] is not None
            and q.answer.lower() in str(condensed[q.document]).lower()]
    figures: dict[str, float | int] = {"questions": len(codex.questions), "documents": len(codex.documents)}
    for mode in MODES:
        figures.update(logs[mode].figures(mode))
    figures.update({
        "codex_tokens_full": codex_tokens["cag"], "codex_tokens_condensed": codex_tokens["condensed"],
        "documents_condensed": sum(text is not None for text in condensed.values()),
        "answers_kept_condensed": len(kept) / len(codex.questions), "condense_s": condense_s,
        "tool_calls_rag": logs["rag"].tool_calls})
    ratios = {"codex_condensed_over_full": codex_tokens["condensed"] / codex_tokens["cag"],
              "prompt_tokens_rag_over_cag": figures["prompt_tokens_rag"] / figures["prompt_tokens_cag"],
              "prompt_tokens_condensed_over_cag": figures["prompt_tokens_condensed"] / figures["prompt_tokens_cag"]}
    notes = {"model": "the served model" if load.base_url else f"{REAL_MODEL.name} ({REAL_CONFIG}, lens off)",
             "server": load.base_url or "started by the bench", "device": engine_device(),
             "load": (f"{len(codex.questions)} questions in {len(codex.documents)} documents, {load.filler} filler "
                      f"sentences a fact, seed {load.seed}, {load.max_tokens}-token replies at temperature 0; "
                      "each question an independent request (no session)"),
             "condensed": (f"auto mode, cag_threshold {threshold:.4f} (full Codex {codex_tokens['cag']} tokens "
                           f"over it, condensed {codex_tokens['condensed']} under)"),
             **{f"right_{mode}": "".join("1" if r else "0" for r in logs[mode].right) for mode in MODES},
             **{f"first_reply_{mode}": logs[mode].replies[0] for mode in MODES}}
    return BenchResult("quality", figures, ratios, notes)
