"""/metrics: vLLM's own series plus AHC's, consistent with what the responses reported."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from bench.servers import scrape_metrics

pytestmark = pytest.mark.engine

PREFIX = " ".join(f"Observation {i}: the left neighbour decides the next symbol." for i in range(40))


def test_metrics_present_and_consistent(server, client: openai.OpenAI, model_name: str) -> None:
    before = scrape_metrics(server.base_url, kind="agent")
    usages = []
    for question in ("one", "two", "three"):
        reply = client.chat.completions.create(
            model=model_name, max_tokens=2, temperature=0,
            messages=[{"role": "system", "content": PREFIX}, {"role": "user", "content": question}])
        usages.append(reply.usage)
    after = scrape_metrics(server.base_url, kind="agent")

    for name in ("ahc_prompt_tokens_total", "ahc_cached_prompt_tokens_total", "ahc_prefix_cache_hit_ratio",
                 "ahc_kv_cache_usage_ratio", "ahc_vram_used_bytes", "ahc_vram_total_bytes",
                 "ahc_compactions_total", "ahc_xdb_rows_written_total", "ahc_xdb_queue_depth", "ahc_audit_head_seq"):
        assert name in after, f"{name} missing from /metrics"
    text = httpx.get(f"{server.base_url}/metrics").text
    assert "vllm:prefix_cache_queries" in text and "vllm:kv_cache_usage_perc" in text

    prompt, cached = after["ahc_prompt_tokens_total"], after["ahc_cached_prompt_tokens_total"]
    assert prompt - before.get("ahc_prompt_tokens_total", 0) == sum(u.prompt_tokens for u in usages)
    assert cached - before.get("ahc_cached_prompt_tokens_total", 0) == sum(
        u.prompt_tokens_details.cached_tokens for u in usages)
    assert 0 < cached <= prompt
    assert after["ahc_prefix_cache_hit_ratio"] == pytest.approx(cached / prompt)
    assert 0 <= after["ahc_kv_cache_usage_ratio"] <= 1
    assert 0 <= after["ahc_vram_used_bytes"] <= after["ahc_vram_total_bytes"]
    assert after["ahc_vram_total_bytes"] > 0
    assert after["ahc_chat_template_prefix_stable"] == 1  # the tiny model's template, checked at start-up
    # The engine's KV events named the requests' session: session admission reads what the cache holds
    # from them.
    deadline = time.monotonic() + 5
    while scrape_metrics(server.base_url)["ahc_session_cache_sessions"] < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert scrape_metrics(server.base_url)["ahc_session_cache_sessions"] >= 1


def test_every_ahc_series_names_the_model(server, model_name: str) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    families = {f.name: f for f in text_string_to_metric_families(httpx.get(f"{server.base_url}/metrics").text)}
    ours = [s for name, f in families.items() if name.startswith("ahc_") for s in f.samples]
    assert ours
    assert all(s.labels.get("model_name") == model_name for s in ours), \
        [s.name for s in ours if s.labels.get("model_name") != model_name]
    assert families["ahc_context_block_tokens"].type == "histogram"

