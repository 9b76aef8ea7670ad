"""Concept activations captured inside the engine: equal to a transformers forward, recorded
in XDB with the tokens, prefix cache kept, recallable by concept over HTTP and the CLI."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from bench.servers import TINY_MODEL, recall, recall_until, start_server
from server.cluster.server_process import AHC

REPO = Path(__file__).resolve().parents[1]  # the checkout under test

pytestmark = pytest.mark.engine

PACK = REPO / ".cache" / "lenses" / "tiny-demo"
# Long enough that the prompt fills whole KV blocks (32 tokens) the second request can read.
IDENTITY = ("You watch a ring of cells. Particles A move right, particles B move left, and when they meet "
            "they collide into K. Count the collisions and say whether the rule is negated. ") * 3


def greedy_reply(client, model_name: str, session_id: str) -> dict:
    return client.chat.completions.create(
        model=model_name, max_tokens=16, temperature=0,
        messages=[{"role": "user", "content": "Which particle moves right?"}],
        extra_body={"return_token_ids": True,
                    "context": {"session_id": session_id, "identity": IDENTITY}}).to_dict()


def expected_activations(prompt_ids: list[int], output_ids: list[int]) -> list[dict[str, float]]:
    """The pack over transformers' hidden_states[layer] at the position that emitted each output token."""
    import torch
    from transformers import AutoModelForCausalLM

    from lens import load_pack

    pack = load_pack(PACK)
    model = AutoModelForCausalLM.from_pretrained(TINY_MODEL, dtype=torch.float32).eval()
    with torch.no_grad():
        states = model(torch.tensor([prompt_ids + output_ids]), output_hidden_states=True).hidden_states
    hidden = states[pack.layer][0].numpy()
    first = len(prompt_ids) - 1
    return [pack.top_concepts(hidden[first + j], k=10) for j in range(len(output_ids))]


def max_abs_diff(rows: list[dict], expected: list[dict[str, float]]) -> float:
    worst = 0.0
    for row, want in zip(rows, expected, strict=True):
        assert row["activation_source"] == "hidden_state"
        assert set(row["concept_activations"]) == set(want)
        worst = max(worst, *(abs(row["concept_activations"][c] - v) for c, v in want.items()))
    return worst


@pytest.fixture(scope="module")
def replies(server, client, model_name) -> tuple[dict, dict]:
    first = greedy_reply(client, model_name, "act-first")
    second = greedy_reply(client, model_name, "act-second")  # identical prompt: served from the cache
    return first, second


def test_recorded_activations_equal_a_transformers_forward(server, replies) -> None:
    first, second = replies
    prompt_ids, output_ids = first["prompt_token_ids"], first["choices"][0]["token_ids"]
    rows = recall_until(server, len(output_ids), session_id="act-first", event_types="output")
    assert [r["token_id"] for r in rows] == output_ids
    diff = max_abs_diff(rows, expected_activations(prompt_ids, output_ids))
    print(f"activations: max abs diff vs transformers {diff:.3g} over {len(rows)} tokens")
    assert diff <= 1e-4


def test_the_prefix_cache_still_serves_and_its_reply_is_measured_too(server, replies) -> None:
    first, second = replies
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    print(f"activations: repeat request read {cached} of {second['usage']['prompt_tokens']} prompt tokens "
          "from the cache")
    assert cached > 0
    assert second["prompt_token_ids"] == first["prompt_token_ids"]
    output_ids = second["choices"][0]["token_ids"]
    rows = recall_until(server, len(output_ids), session_id="act-second", event_types="output")
    assert max_abs_diff(rows, expected_activations(second["prompt_token_ids"], output_ids)) <= 1e-4


def test_a_reply_cut_short_still_records_its_tokens_and_invents_nothing(server, client, model_name) -> None:
    stream = client.chat.completions.create(
        model=model_name, max_tokens=400, temperature=0, stream=True, extra_body={"ignore_eos": True,
        "context": {"session_id": "act-abort", "identity": "You go on and on."}},
        messages=[{"role": "user", "content": "Talk until I hang up."}])
    received = 0
    for _chunk in stream:
        received += 1
        if received == 5:
            break
    stream.close()  # the client hangs up: vLLM aborts the request
    rows = recall_until(server, 4, timeout=5.0, session_id="act-abort", event_types="output")
    assert len(rows) >= 4
    for row in rows:
        measured = row["activation_source"] == "hidden_state"
        assert measured == bool(row["concept_activations"]), row
        assert row["activation_source"] in ("hidden_state", None)


def pick_threshold(rows: list[dict]) -> tuple[str, float, list[int]]:
    """A concept and a value that some, but not all, of the rows reach; the ticks that reach it."""
    concept = next(iter(rows[0]["concept_activations"]))
    values = sorted(r["concept_activations"][concept] for r in rows)
    threshold = values[len(values) // 2]
    return concept, threshold, [r["tick"] for r in rows if r["concept_activations"][concept] >= threshold]


def test_recall_by_concept_over_http_and_the_cli(server, replies, tmp_path: Path) -> None:
    rows = recall_until(server, len(replies[0]["choices"][0]["token_ids"]), session_id="act-first",
                        event_types="output")
    concept, threshold, ticks = pick_threshold(rows)
    assert 0 < len(ticks) < len(rows) or len(set(r["concept_activations"][concept] for r in rows)) == 1
    found = recall(server, session_id="act-first", concept=concept, min_activation=threshold)
    assert [r["tick"] for r in found] == ticks
    assert all(r["concept_activations"][concept] >= threshold for r in found)
    # The server holds the experience file open for writing; the CLI reads a copy of it.
    copy = tmp_path / "xdb"
    copy.mkdir()
    for name in ("experience.duckdb", "experience.duckdb.wal"):
        if (server.data_dir / name).exists():
            shutil.copy(server.data_dir / name, copy / name)
    out = subprocess.run([AHC, "xdb", "recall", "--data-dir", str(copy), "--session-id", "act-first",
                          "--concept", concept, "--min-activation", repr(threshold)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    printed = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["tick"] for r in printed] == ticks


def test_concepts_show_the_packs_hierarchy(server, replies) -> None:
    with server.http() as http:
        concepts = {c["name"]: c for c in http.get("/v1/xdb/concepts").json()["data"]}
    assert {"motion", "motion-right", "motion-left", "collision", "counting", "negation"} <= set(concepts)
    assert concepts["motion"]["children"] == ["motion-left", "motion-right"]
    assert concepts["motion-right"]["parent"] == "motion"
    assert concepts["motion-right"]["display_name"] == "Moving right"
    assert concepts["collision"]["parent"] is None and concepts["collision"]["tag_id"] is not None


def test_a_pack_for_another_model_stops_start_up(tmp_path: Path) -> None:
    other = tmp_path / "other-model"
    other.mkdir()
    config = json.loads((TINY_MODEL / "config.json").read_text())
    config["rms_norm_eps"] = 1e-5  # same sizes, another model: the config hash differs
    (other / "config.json").write_text(json.dumps(config))
    out = subprocess.run([AHC, "serve", "--config", str(REPO / "configs" / "cpu-tiny.yaml"), "--model", str(other),
                          "--data-dir", str(tmp_path / "xdb"), "--port", "0"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert "lens.pack" in out.stderr and "config_sha256" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


@pytest.fixture(scope="module")
def logit_lens_server(tmp_path_factory):
    """A server whose lens reads token sets from the logits (the fallback where hidden states cannot be
    reached), with a pack trained here (`ahc lens train` writes the token sets). Its prompts are
    prefilled in 64-token chunks, so the rows of chunks that produce no token must be dropped."""
    import yaml

    root = tmp_path_factory.mktemp("logit-lens")
    pack = root / "pack"
    train = subprocess.run([AHC, "lens", "train", "--model", str(TINY_MODEL), "--examples",
                            str(REPO / "configs" / "lenses" / "tiny-demo" / "examples.json"), "--layer", "1",
                            "--out", str(pack)], capture_output=True, text=True, timeout=300)
    assert train.returncode == 0, train.stderr
    config = yaml.safe_load((REPO / "configs" / "cpu-tiny.yaml").read_text())
    config["lens"] = {"enabled": True, "pack": str(pack), "source": "logit_lens"}
    config["engine"]["max_num_batched_tokens"] = 64
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    server = start_server(root / "xdb", api_key=None, config=root / "config.yaml")
    yield server, pack
    server.stop()


def test_the_logit_lens_fallback_equals_transformers_logprobs(logit_lens_server) -> None:
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from lens import load_pack

    server, pack_dir = logit_lens_server
    reply = greedy_reply(server.client(), server.client().models.list().data[0].id, "logit-lens")
    prompt_ids, output_ids = reply["prompt_token_ids"], reply["choices"][0]["token_ids"]
    assert len(prompt_ids) > 2 * 64  # three prefill chunks, the first two produce no token
    rows = recall_until(server, len(output_ids), session_id="logit-lens", event_types="output")
    assert [r["token_id"] for r in rows] == output_ids
    pack = load_pack(pack_dir)
    sets = pack.extra["token_sets"]
    model = AutoModelForCausalLM.from_pretrained(TINY_MODEL, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + output_ids])).logits[0].double()
    logprobs = torch.log_softmax(logits, dim=-1).numpy()
    worst = 0.0
    for j, row in enumerate(rows):
        step = logprobs[len(prompt_ids) - 1 + j]
        want = {c: float(np.logaddexp.reduce(step[ids])) for c, ids in sets.items()}
        assert row["activation_source"] == "logit_lens"
        assert set(row["concept_activations"]) == set(want)
        worst = max(worst, *(abs(row["concept_activations"][c] - v) for c, v in want.items()))
    print(f"logit lens: max abs diff vs transformers {worst:.3g} over {len(rows)} tokens")
    assert worst <= 1e-4
