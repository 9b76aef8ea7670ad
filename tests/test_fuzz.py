"""Schema fuzzing: schemathesis generates requests from the server's own OpenAPI document and sends them
to one real `ahc serve` (the tiny model). Whatever it sends, the server must never answer 5xx, and every
4xx must be in OpenAI's error shape, since clients written against OpenAI parse it.

AHC's own routes (`/v1/xdb/*`, `/v1/context/*`, the audit log's records by an auditor's key) get many
examples: they are cheap. The generating routes (`/v1/chat/completions`, `/v1/completions`,
`/v1/messages`, `/v1/responses`) get few, with the completion budget clamped so a request that does
validate costs a few tokens; most generated bodies fail validation, which is cheap too. `/v1/messages`
answers in Anthropic's error shape, the rest in OpenAI's.

The schema's own values stop short of the edges of their types: Hypothesis's strings never hold a lone
surrogate, and its date-times are never within a day of year 1 or 9999 with an offset that carries them
off the calendar. So half the time a field that reaches an id or a key (in a body) or a time bound (in a
query) takes such a value instead (`at_the_edges`). The generating routes also get the headers a retrying
client sends (`Idempotency-Key`, `X-Stainless-Retry-Count`) and a session named in `X-Session-ID`, drawn
from a few values so that retries, reused keys with other words and shared sessions all occur.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.errors import UnsupportedSchema

from bench.servers import TINY_MODEL, start_server
from server.cluster.server_process import ServerProcess

pytestmark = [pytest.mark.slow, pytest.mark.engine]

API_KEY = "fuzz-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
AUDITOR_KEY = "fuzz-audit-key"  # the audit log answers an auditor's key and no tenant's
AUDITOR = {"Authorization": f"Bearer {AUDITOR_KEY}"}
GENERATING = r"^/v1/((chat/)?completions|messages|responses)$"
# A cap on what one generated request may cost the engine: a random model never stops early, so an
# unclamped `max_tokens` would have it generate to the end of the window.
MAX_TOKENS = 4
MAX_CHOICES = 2
# Body fields whose strings become ids or keys XDB stores or looks up, and query fields that are times.
ID_FIELDS = frozenset({"request_id", "prompt_cache_key", "conversation", "previous_response_id", "user", "session_id"})
TIME_FIELDS = frozenset({"since", "until"})
# Half of a UTF-16 pair, alone (JSON's "\ud800" escape: the client escapes it), after some text or none.
LONE_SURROGATES = st.builds(str.__add__, st.text(max_size=3), st.characters(categories=["Cs"]))
EDGE_TIMES = st.sampled_from(["0001-01-01T00:00:00Z", "0001-01-01T00:00:00+01:00", "0001-01-01T00:30:00+14:00",
                              "9999-12-31T23:59:59-01:00", "9999-12-31T23:59:59.999999-12:00",
                              "9999-12-31T23:59:59.999999Z"])

RETRY_HEADERS = st.fixed_dictionaries({}, optional={
    "Idempotency-Key": st.sampled_from(["fuzz-key-1", "fuzz-key-2", "", "k" * 300]),
    "X-Stainless-Retry-Count": st.sampled_from(["0", "1", "2", "-1", "99999999999999999999999", "3.5", "two"]),
    "X-Session-ID": st.sampled_from(["fuzz-a", "fuzz-b"]),
})

stats: Counter[str] = Counter()
refusals: Counter[str] = Counter()  # why requests were refused, printed with the stats


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    """A server of this module's own, not the session's shared one: the fuzzer pins, compacts, tags and
    writes documents at random, which would change what the other engine tests find in XDB."""
    if not (TINY_MODEL / "config.json").exists():
        raise RuntimeError("the tiny model is missing: run `make setup` first")
    home = tmp_path_factory.mktemp("fuzz")
    keys = home / "keys"
    keys.write_text(f"auditor fuzz-auditor:{AUDITOR_KEY}\n")
    keys.chmod(0o600)
    srv = start_server(home / "xdb", api_key=API_KEY, extra=["--api-keys-file", str(keys)])
    started = time.monotonic()
    yield srv
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        print(f"\nfuzz: {stats['requests']} requests in {time.monotonic() - started:.0f} s")
        for key, count in sorted(stats.items()):
            print(f"  {key}: {count}")
        print("most frequent refusals:")
        for reason, count in refusals.most_common(15):
            print(f"  {count:4d}  {reason}")
    srv.stop()


@pytest.fixture(scope="module")
def openapi(fuzz_server: ServerProcess) -> Any:
    schema = schemathesis.openapi.from_url(f"{fuzz_server.base_url}/openapi.json", headers=AUTH, timeout=30)
    schema.config.update(base_url=fuzz_server.base_url, headers=AUTH, request_timeout=120)
    return schema


@pytest.fixture(scope="module")
def served_model(fuzz_server: ServerProcess) -> str:
    with fuzz_server.http() as http:
        return http.get("/v1/models").json()["data"][0]["id"]


def openai_error_shape(ctx: Any, response: Any, case: Any) -> None:
    """Every 4xx is `{"error": {"message": str, "type": str, "param": ..., "code": ...}}` and nothing else;
    on the Messages API, Anthropic's `{"type": "error", "error": {"type": str, "message": str}}`."""
    if not 400 <= response.status_code < 500:
        return
    try:
        body = response.json()
    except ValueError as exc:
        raise AssertionError(f"{response.status_code} body is not JSON: {response.text[:300]!r}") from exc
    if case.path.startswith("/v1/messages"):
        assert isinstance(body, dict) and body.get("type") == "error", f"not Anthropic's shape: {response.text[:300]}"
        assert isinstance(body.get("error"), dict) and isinstance(body["error"].get("type"), str) and \
            isinstance(body["error"].get("message"), str), f"not Anthropic's error shape: {response.text[:300]}"
        return
    assert isinstance(body, dict) and set(body) == {"error"}, f"not OpenAI's error shape: {response.text[:300]}"
    error = body["error"]
    assert isinstance(error, dict), f"`error` is not an object: {response.text[:300]}"
    assert {"message", "type", "param", "code"} <= set(error), f"`error` lacks fields: {response.text[:300]}"
    assert isinstance(error["message"], str) and isinstance(error["type"], str), response.text[:300]


CHECKS = [not_a_server_error, openai_error_shape]


def operations(schema: Any, path_regex: str) -> list[Any]:
    found = [result.ok() for result in schema.include(path_regex=path_regex).get_all_operations()]
    assert found, f"no operation matches {path_regex}"
    return found


def at_the_edges(case: Any, edges: st.DataObject) -> None:
    """Each id field of the case's body, and each time field of its query, takes a value at the edge of
    its type (a lone surrogate, a time off the calendar once in UTC) with even odds."""
    for container, fields, values in ((case.body, ID_FIELDS, LONE_SURROGATES), (case.query, TIME_FIELDS, EDGE_TIMES)):
        if not isinstance(container, dict):
            continue
        for field in sorted(fields & container.keys()):
            if edges.draw(st.booleans()):
                container[field] = edges.draw(values)


def fuzz(operation: Any, max_examples: int, prepare: Callable[[Any], None] | None = None,
         modes: tuple[GenerationMode, ...] = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE),
         headers: dict[str, str] = AUTH, extra_headers: st.SearchStrategy[dict[str, str]] | None = None,
         edges: bool = True) -> str | None:
    """One operation, half valid bodies and queries, half invalid ones (by default), some fields at the
    edges of their types (`edges`); the first failure, shrunk by Hypothesis, or None. (schemathesis's own pytest
    plugin is not used: its lazy-fixture runner sets `Function._nodeid`, which pytest 9 no longer has.)"""
    strategy = st.one_of(*(operation.as_strategy(mode) for mode in modes))

    @given(case=strategy, edge_values=st.data())
    # The rest (derandomized or not) from the loaded profile (tests/conftest.py).
    @settings(max_examples=max_examples, suppress_health_check=list(HealthCheck), phases=[Phase.generate, Phase.shrink])
    def run(case: Any, edge_values: st.DataObject) -> None:
        if prepare is not None:
            prepare(case)
        if edges:
            at_the_edges(case, edge_values)
        stats["requests"] += 1
        sent = headers if extra_headers is None else {**headers, **edge_values.draw(extra_headers)}
        response = case.call_and_validate(headers=sent, checks=CHECKS)
        stats[f"{operation.path} {response.status_code // 100}xx"] += 1
        if response.status_code >= 400:
            refusals[f"{operation.path}: {response.json()['error']['message'][:100]}"] += 1

    try:
        run()
    except (Exception, BaseExceptionGroup) as exc:  # schemathesis reports failures as a BaseExceptionGroup
        if generator_limit(exc) and GenerationMode.NEGATIVE in modes:
            # Schemathesis cannot always invert a schema for its invalid bodies (a `not` it cannot spell
            # out below the root, met or not depending on which part its negative mode mutates): the
            # generator's limit, not the server's fault, so the operation is fuzzed with valid bodies
            # alone, and the fallback is counted in the printed stats.
            stats[f"{operation.path}: valid bodies only ({exc})"[:160]] += 1
            return fuzz(operation, max_examples, prepare, (GenerationMode.POSITIVE,), headers, extra_headers, edges)
        return f"{operation.label}: {exc}"  # the message holds the shrunk request as a curl command
    return None


def examples(share: float, least: int = 1) -> int:
    """`share` of the loaded Hypothesis profile's example count (tests/conftest.py: `ci` or `deep`), at
    least `least`."""
    return max(least, round(settings().max_examples * share))


def generator_limit(exc: BaseException) -> bool:
    """Schemathesis could not generate a case from the schema (no request was judged)."""
    if isinstance(exc, BaseExceptionGroup):
        return all(generator_limit(e) for e in exc.exceptions)
    return isinstance(exc, UnsupportedSchema)


def test_ahc_routes(openapi: Any) -> None:
    failures = [f for op in operations(openapi, r"^/v1/(xdb|context)/") if (f := fuzz(op, examples(1)))]
    failures += [f for op in operations(openapi, r"^/v1/audit/records$")
                 if (f := fuzz(op, examples(0.1, 3), headers=AUDITOR))]
    assert not failures, "\n\n".join(failures)


def test_generating_routes(openapi: Any, served_model: str) -> None:
    def prepare(case: Any) -> None:
        if isinstance(case.body, dict):
            cheapen(case.body, served_model, "max_output_tokens" if case.path == "/v1/responses" else "max_tokens")

    failures = [f for op in operations(openapi, GENERATING)
                if (f := fuzz(op, examples(1 / 3, 30), prepare, extra_headers=RETRY_HEADERS))]
    failures += [f for op in operations(openapi, r"^/v1/models$") if (f := fuzz(op, examples(1 / 30)))]
    assert not failures, "\n\n".join(failures)


# What an ordinary client of `/v1/completions` sends. vLLM's request takes some fifty optional fields
# whose combinations its validators mostly refuse (prompt_embeds with a prompt, stream_options without
# stream, structured outputs of two kinds...), so bodies generated over all of them are nearly all 400s
# and the handler behind validation is never reached; over these fields a generated body usually is.
CLIENT_FIELDS = {"model", "prompt", "max_tokens", "temperature", "top_p", "n", "stream", "seed", "stop",
                 "echo", "logprobs", "presence_penalty", "frequency_penalty", "user", "logit_bias"}


def test_generated_completions_reach_the_handler(openapi: Any, served_model: str) -> None:
    """Valid bodies over an ordinary client's fields: most are served (2xx), none is a 5xx, and what
    is refused is refused in OpenAI's shape."""
    before = stats["/v1/completions 2xx"], stats["requests"]

    def prepare(case: Any) -> None:
        if isinstance(case.body, dict):
            for key in set(case.body) - CLIENT_FIELDS:
                del case.body[key]
            if not case.body.get("prompt"):  # an ordinary client always sends one (the schema cannot say so)
                case.body["prompt"] = "Hello"
            cheapen(case.body, served_model)

    [operation] = operations(openapi, r"^/v1/completions$")
    # Valid bodies as a client sends them: no field at the edge of its type (those are refused, as tested above).
    failure = fuzz(operation, examples(0.2, 8), prepare, modes=(GenerationMode.POSITIVE,), edges=False)
    assert failure is None, failure
    served, sent = stats["/v1/completions 2xx"] - before[0], stats["requests"] - before[1]
    assert served >= sent // 4, f"only {served} of {sent} generated completions reached the handler"


def cheapen(body: dict[str, Any], served_model: str, budget: str = "max_tokens") -> None:
    """Bound what a generated body can cost the engine, leaving anything invalid as generated (its 400
    is what is being tested, and it costs nothing). A random `model` would stop nearly every body at the
    model lookup, so the served model's name is put in to let the rest of the body through. `budget`:
    the API's name for the completion budget."""
    if isinstance(body.get("model"), str) or "model" not in body:
        body["model"] = served_model
    if body.get(budget) is None:  # absent or null, it means the rest of the window
        body[budget] = MAX_TOKENS
    for field in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        value = body.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value > MAX_TOKENS:
            body[field] = MAX_TOKENS
    for field in ("n", "best_of"):
        value = body.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value > MAX_CHOICES:
            body[field] = MAX_CHOICES
