"""End-to-end: eviction telemetry on a real CPU server (``--kv-policy vase`` with a
calibration's KL mappings, metrics on, the planted-loop logit processor allowed).

* the signal a request reports equals the fidelity loop's on the same sequence, for a
  policy that scores with the window queries and for one that reads none;
* ``kv_estimated_kl`` is the calibration's mapping of the signal (per pair, or model-wide);
* a planted loop is found at its first token, and ``kv_stop_on_loop`` ends the request
  where its first phrase of 10 characters completes its fifth occurrence; an output
  without a loop is not flagged;
* the OpenAI routes carry the fields (``metadata.kv``), streaming or not;
* ``/kv_policy`` and ``/metrics`` hold the fleet view, and the Grafana dashboard's every
  query names a series this server exports.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import requests
import torch
from support.constants import PROMPT, SEED, B, R
from support.e2e import greedy, tokens
from support.telemetry import MODEL_SLOPE, PAIR_SLOPE, plant_processor

from vase_sglang.config import PolicyConfig
from vase_sglang.policies import make_policy
from vase_sglang.telemetry import EvictedAttention, Loop, LoopDetector

pytestmark = pytest.mark.server

ROOT = Path(__file__).resolve().parents[2]
SIGNAL_TOL = 1e-5


@pytest.mark.parametrize("policy", ["vase", "curdkv"])
def test_the_served_signal_equals_the_fidelity_loops_on_the_same_sequence(telemetry_server, tiny_model,
                                                                           policy: str) -> None:
    """The loop teacher-forces the server's own tokens with the same policy, seed and rounds
    (curdkv reads no queries: the server records them for the telemetry alone)."""
    from transformers import AutoModelForCausalLM

    from vase_sglang.fidelity.loop import BatchedDecoder

    out = greedy(telemetry_server, 400, custom_params={"kv_policy": policy})
    meta = out["meta_info"]
    assert meta["kv_policy"] == policy and meta["kv_eviction_rounds"] >= 5
    served = tokens(out)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    decoder = BatchedDecoder(model)
    decoder.prefill([PROMPT])
    arm = decoder.new_arm(policy, make_policy(PolicyConfig(policy=policy, budget=B, recent=R), backend="torch"),
                          row_seeds=[SEED], measure=True)
    fed = torch.tensor([served[:-1]])  # the last token is sampled, never fed
    for c in range(0, fed.shape[1], R):
        decoder.feed(arm, fed[:, c : c + R])
    loop = EvictedAttention()
    for generated, per_row in arm.signals:
        loop.add(per_row[0], generated)
    assert loop.rounds == meta["kv_eviction_rounds"]
    assert abs(loop.statistic("mean", len(served)) - meta["kv_evicted_attention"]) < SIGNAL_TOL
    assert abs(loop.statistic("max", len(served)) - meta["kv_evicted_attention_max"]) < SIGNAL_TOL
    assert 0 < meta["kv_evicted_attention"] < 1


def test_the_estimate_is_the_calibrations_mapping_of_the_signal(telemetry_server) -> None:
    vase = greedy(telemetry_server, 300)["meta_info"]
    assert vase["kv_estimated_kl"] == pytest.approx(PAIR_SLOPE * vase["kv_evicted_attention"], rel=1e-6)
    assert f"vase B={B} isotonic" in vase["kv_kl_mapping"] and "tiny-calibration.json" in vase["kv_kl_mapping"]
    other = greedy(telemetry_server, 300, custom_params={"kv_policy": "streamingllm"})["meta_info"]
    signal = other["kv_evicted_attention"]
    assert other["kv_estimated_kl"] == pytest.approx(MODEL_SLOPE * min(signal, 0.5), rel=1e-6)
    assert "model-wide isotonic" in other["kv_kl_mapping"]
    full = greedy(telemetry_server, 300, custom_params={"kv_policy": "none"})["meta_info"]
    assert (full["kv_evicted_attention"], full["kv_estimated_kl"]) == (None, 0.0)
    short = greedy(telemetry_server, 100)["meta_info"]  # never fills its region: nothing evicted yet
    assert (short["kv_eviction_rounds"], short["kv_estimated_kl"]) == (0, 0.0)


def _phrase(tiny_model) -> tuple[list[int], Loop]:
    """The planted phrase's tokens, and the loop the algorithm layer's detector finds in the
    planted output (the server must report the same one)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    ids = tok.encode(" kv cache token decode", add_special_tokens=False)
    assert 10 <= len(tok.decode(ids)) <= 40 and len(set(ids)) == len(ids)
    loop = LoopDetector(tok.decode).feed(list(range(100, 100 + START)) + ids * 60)
    assert loop is not None
    return ids, loop


def _planted(server, plan: list[int], max_new: int, **custom) -> dict:
    body = {"input_ids": PROMPT, "custom_logit_processor": plant_processor(), "return_logprob": True,
            "sampling_params": {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True,
                                "custom_params": {"plant": plan, **custom}}}
    r = requests.post(server.url + "/generate", json=body, timeout=300)
    r.raise_for_status()
    return r.json()


START = 37  # output tokens before the planted loop: distinct, so no loop of their own


def test_a_planted_loop_is_found_at_its_first_token(telemetry_server, tiny_model) -> None:
    phrase, expected = _phrase(tiny_model)
    plan = list(range(100, 100 + START)) + phrase * 60
    out = _planted(telemetry_server, plan, 200)
    meta = out["meta_info"]
    assert tokens(out) == plan[:200]
    assert meta["kv_loop"] is True and meta["kv_loop_start"] == expected.start == START
    assert meta["finish_reason"]["type"] == "length" and meta["completion_tokens"] == 200
    clean = _planted(telemetry_server, list(range(100, 300)), 200)["meta_info"]  # 200 distinct tokens
    assert clean["kv_loop"] is False and clean["kv_loop_start"] == -1


def test_stop_on_loop_ends_the_request_at_the_fifth_occurrence(telemetry_server, tiny_model) -> None:
    phrase, expected = _phrase(tiny_model)
    plan = list(range(100, 100 + START)) + phrase * 60
    out = _planted(telemetry_server, plan, 200, kv_stop_on_loop=True)
    meta = out["meta_info"]
    detected = expected.detected_at
    assert START + 4 * len(phrase) <= detected < START + 5 * len(phrase)  # in the phrase's 5th copy
    assert meta["completion_tokens"] == detected + 1
    assert meta["finish_reason"]["type"] == "stop"
    loop = meta["finish_reason"]["kv_loop"]
    assert loop == {"start": START, "phrase_tokens": expected.phrase_tokens,
                    "phrase_chars": expected.phrase_chars, "detected_at": detected}
    assert 10 <= loop["phrase_chars"] <= 40
    # The same through the OpenAI completions route: a plain "stop" there.
    body = {"model": "default", "prompt": "hi", "max_tokens": 200, "temperature": 0,
            "custom_logit_processor": plant_processor(),
            "custom_params": {"plant": plan, "kv_stop_on_loop": True}}
    r = requests.post(telemetry_server.url + "/v1/completions", json=body, timeout=300).json()
    assert r["choices"][0]["finish_reason"] == "stop" and r["usage"]["completion_tokens"] == detected + 1
    assert r["metadata"]["kv"][0]["kv_loop_start"] == START
    bad = requests.post(telemetry_server.url + "/generate", timeout=60, json={
        "input_ids": PROMPT, "sampling_params": {"max_new_tokens": 4, "custom_params": {"kv_stop_on_loop": "yes"}}})
    assert bad.status_code == 400 and "kv_stop_on_loop" in bad.text


def test_the_openai_routes_carry_the_fields_streaming_or_not(telemetry_server) -> None:
    chat = {"model": "default", "messages": [{"role": "user", "content": "the kv cache"}], "max_tokens": 240,
            "temperature": 0.8, "n": 2, "ignore_eos": True}
    r = requests.post(telemetry_server.url + "/v1/chat/completions", json=chat, timeout=300).json()
    kv = r["metadata"]["kv"]
    assert len(kv) == 2 and all(k["kv_eviction_rounds"] >= 1 and 0 < k["kv_evicted_attention"] < 1 for k in kv)
    assert all("kv_estimated_kl" in k for k in kv)
    for route, body in (("/v1/chat/completions", {**chat, "n": 1}),
                        ("/v1/completions", {"model": "default", "prompt": "the kv cache", "max_tokens": 240,
                                             "ignore_eos": True})):
        with requests.post(telemetry_server.url + route, json={**body, "stream": True}, stream=True,
                           timeout=300) as resp:
            lines = [ln.decode() for ln in resp.iter_lines() if ln]
        assert lines[-1] == "data: [DONE]"
        last = json.loads(lines[-2].removeprefix("data: "))
        assert last["choices"] == [] and last["metadata"]["kv"][0]["kv_eviction_rounds"] >= 1, route


def test_kv_policy_and_metrics_hold_the_fleet_view(telemetry_server) -> None:
    for _ in range(2):
        greedy(telemetry_server, 300)
    body = requests.get(telemetry_server.url + "/kv_policy", timeout=30).json()
    assert body["telemetry"]["enabled"] and body["telemetry"]["kl_estimator"]["statistic"] == "mean"
    row = body["totals"]["telemetry"][f"vase B={B}"]
    assert row["requests_evicted"] >= 2 and 0 < row["evicted_attention_mean"] < 1 and row["estimated"] >= 2
    from prometheus_client.parser import text_string_to_metric_families

    families = {f.name: f for f in text_string_to_metric_families(
        requests.get(telemetry_server.url + "/metrics", timeout=30).text)}
    signal = families["vase:request_evicted_attention"]
    counts = {s.labels["policy"]: s.value for s in signal.samples if s.name.endswith("_count")}
    assert counts["vase"] >= 2
    buckets = [s for s in signal.samples if s.name.endswith("_bucket") and s.labels["policy"] == "vase"]
    values = [s.value for s in sorted(buckets, key=lambda s: float(s.labels["le"]))]
    assert values == sorted(values) and values[-1] == counts["vase"]  # cumulative, +Inf holds all
    for name in ("vase:request_estimated_kl", "vase:round_evicted_attention", "vase:requests_finished",
                 "vase:loops"):
        assert name in families, name
    finished = {s.labels["policy"]: s.value for s in families["vase:requests_finished"].samples
                if s.name.endswith("_total")}
    assert finished["vase"] >= counts["vase"]


def test_every_dashboard_query_names_a_series_the_server_exports(telemetry_server) -> None:
    greedy(telemetry_server, 300)
    text = requests.get(telemetry_server.url + "/metrics", timeout=30).text
    exported = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
    dashboard = json.loads((ROOT / "monitoring" / "grafana" / "vase-sglang.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 8
    for expr in exprs:
        names = set(re.findall(r"(?:vase|sglang):[a-z_]+", expr))
        assert names and names <= exported, (expr, sorted(names - exported))
