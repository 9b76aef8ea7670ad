"""Whether a request says it is sent again: the headers the orchestrator's retried turns are told by
(orchestrator/turn_retry.py)."""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.turn_retry import Retry

IDEMPOTENCY_KEY = "Idempotency-Key"  # the HTTP convention: the same key on every attempt of one request
SDK_RETRY_COUNT = "X-Stainless-Retry-Count"  # the official openai and anthropic SDKs: 0, then 1, 2... on retries


def request_retry(headers: Mapping[str, str]) -> Retry:
    return Retry.of(headers.get(IDEMPOTENCY_KEY), headers.get(SDK_RETRY_COUNT))
