"""End-to-end: the real SGLang server on CPU with ``--kv-policy vase``.

Servers are session fixtures (one per configuration per run) and run with SGLang's own
leak and double-free checks on (``SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY=1``,
``SGLANG_CHECK_KV_PAGE_INVARIANTS=1``).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import torch
from support.constants import PROMPT, REGION, B, R
from support.e2e import assert_matches_reference, greedy, launch_each, prefix_digests, tokens, wait_idle

pytestmark = pytest.mark.server

BAD_FLAGS = [
    (("--kv-policy", "bogus"), "argument --kv-policy: invalid choice: 'bogus'"),
    (("--kv-policy", "vase", "--kv-budget", "100", "--kv-recent", "64"),
     "invalid --kv-budget 100: must be a multiple of recent=64"),
    (("--kv-policy", "vase", "--kv-policy-config", '{"n_large": 9999}'), "invalid --kv-policy-config field 'n_large'"),
    (("--kv-policy", "vase", "--enable-mixed-chunk", "--attention-backend", "torch_native"),
     "--kv-policy vase cannot run with: --enable-mixed-chunk"),
    (("--kv-policy", "vase", "--kv-telemetry", "maybe"), "argument --kv-telemetry: invalid choice: 'maybe'"),
    (("--kv-policy", "none", "--kv-guards", "no"), "argument --kv-guards: invalid choice: 'no'"),
]


@pytest.fixture(scope="module")
def command_lines(tiny_model) -> list:
    """``python -m sglang.launch_server`` with --help, then with each of BAD_FLAGS (SGLang
    imported once, each run in its own forked child: support.e2e.launch_each)."""
    return launch_each(["--help"], *(["--model-path", str(tiny_model), "--device", "cpu", *args]
                                     for args, _ in BAD_FLAGS))


def test_help_lists_kv_flags(command_lines: list) -> None:
    out = command_lines[0]
    assert out.returncode == 0, out.stderr[-2000:]
    for flag in ("--kv-policy", "--kv-budget", "--kv-recent", "--kv-seed", "--kv-policy-config", "--kv-calibration",
                 "--kv-telemetry", "--kv-stop-on-loop", "--kv-guards"):
        assert flag in out.stdout


@pytest.mark.parametrize("case", range(len(BAD_FLAGS)), ids=[m for _, m in BAD_FLAGS])
def test_bad_flags_exit_nonzero_with_a_clear_message(case: int, command_lines: list) -> None:
    out, message = command_lines[1 + case], BAD_FLAGS[case][1]
    assert out.returncode != 0
    assert message in out.stderr, out.stderr[-2000:]


def test_long_generation_stays_bounded_and_matches_full_cache_until_first_eviction(vase_server, none_server) -> None:
    vase = greedy(vase_server, 1000)
    meta = vase["meta_info"]
    assert meta["completion_tokens"] == 1000
    assert meta["kv_region_len"] <= REGION
    assert meta["kv_eviction_rounds"] >= 1
    assert meta["kv_evicted_tokens"] == R * meta["kv_eviction_rounds"]
    full = greedy(none_server, 1000)
    assert "kv_eviction_rounds" not in full["meta_info"]  # --kv-policy none is stock SGLang
    # Prefill gives token 1; decode step j feeds token j, so the first round runs before
    # token REGION + 1 is fed: tokens 1 .. REGION + 1 come from the full cache.
    assert tokens(vase)[: REGION + 1] == tokens(full)[: REGION + 1]
    assert tokens(vase) != tokens(full), "eviction should change a random-weight model's greedy output"


LOGPROB_TOL = 1e-4


@pytest.mark.parametrize("policy", ["vase", "h2o", "gkv", "tova"])
def test_logits_match_a_reference_decode_loop_after_several_rounds(vase_server, tiny_model, policy: str) -> None:
    """HF transformers weights + our torch policy, same seed and rounds: same log-probs.

    The comparison is teacher-forced on the server's tokens. A wrong position, a wrong
    kept set or a wrong compaction shifts the log-probs by far more than the tolerance
    (a different seed moves them by ~0.8, no eviction by ~2.8 on this model). The
    stateful policies (h2o, gkv) also carry their scores from round to round; tova reads
    the newest query from the server's circular ring.
    """
    from transformers import AutoModelForCausalLM

    extra = {} if policy == "vase" else {"custom_params": {"kv_policy": policy}}
    out = greedy(vase_server, 400, **extra)
    assert out["meta_info"]["kv_eviction_rounds"] >= 5 and out["meta_info"]["kv_policy"] == policy
    assert not out["meta_info"]["kv_reprefilled_tokens"]
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    assert_matches_reference(model, policy, PROMPT, out, tol=LOGPROB_TOL)


def _prompt_300() -> list[int]:
    return [(13 * i + 7) % 400 + 50 for i in range(300)]


def test_shared_prefix_stays_in_the_tree_untouched(vase_server, none_server) -> None:
    prompt = _prompt_300()
    n_new = 300  # past several rounds: the first at 160, then every 32

    def run(_: int) -> dict:
        return greedy(vase_server, n_new, input_ids=prompt, temperature=0.8, top_p=0.95)

    with ThreadPoolExecutor(8) as pool:
        first = pool.submit(run, 0)
        time.sleep(1.0)  # the first request's prefill publishes the prompt
        rest = list(pool.map(run, range(1, 8)))
        outs = [first.result(), *rest]
    metas = [o["meta_info"] for o in outs]
    assert all(m["kv_eviction_rounds"] >= 4 for m in metas)
    # Computed once: every later request found the prompt in the tree.
    assert all(m["cached_tokens"] >= len(prompt) - 1 for m in metas[1:]), [m["cached_tokens"] for m in metas]
    # The prompt's K/V bytes (all layers, both K and V) are bit-identical at the start of
    # each region and after every round, in every request.
    oracle = prefix_digests(vase_server.digest_file)
    digests = [oracle[m["id"]] for m in metas]
    assert all(len(d) == 1 + m["kv_eviction_rounds"] for d, m in zip(digests, metas, strict=True))
    assert len({x for d in digests for x in d}) == 1

    # A follow-up whose prompt contains an answer must not get compacted KV from the tree:
    # only the original prompt is cached, while stock SGLang also caches the answer.
    answer = tokens(outs[0])[:-1]
    follow = prompt + answer + [60, 61, 62]
    again = greedy(vase_server, 4, input_ids=follow)["meta_info"]
    assert again["cached_tokens"] <= len(prompt)
    stock = greedy(none_server, n_new, input_ids=prompt)
    stock_follow = prompt + tokens(stock)[:-1] + [60, 61, 62]
    assert greedy(none_server, 4, input_ids=stock_follow)["meta_info"]["cached_tokens"] > len(prompt)


def test_per_request_override_and_bad_fields(vase_server) -> None:
    opted_out = greedy(vase_server, 300, custom_params={"kv_policy": "none"})["meta_info"]
    assert opted_out["kv_eviction_rounds"] == 0 and opted_out["kv_region_len"] == 299
    smaller = greedy(vase_server, 300, custom_params={"kv_budget": 64})["meta_info"]
    assert smaller["kv_region_len"] <= 64 + R and smaller["kv_eviction_rounds"] >= 5
    default = greedy(vase_server, 300)["meta_info"]
    assert default["kv_region_len"] <= REGION and default["kv_eviction_rounds"] >= 1
    for bad, needle in (({"kv_budget": 100}, "kv_budget"), ({"kv_budget": 4096}, "kv_budget"),
                        ({"kv_policy": "bogus"}, "kv_policy"), ({"kv_recent": 8}, "kv_recent")):
        body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 4, "custom_params": bad}}
        r = requests.post(vase_server.url + "/generate", json=body, timeout=60)
        assert r.status_code == 400, (bad, r.status_code, r.text)
        assert needle in r.text
    # OpenAI API: custom_params in the body (extra_body in the openai client).
    chat = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "custom_params": {"kv_budget": 100}}
    r = requests.post(vase_server.url + "/v1/chat/completions", json=chat, timeout=60)
    assert r.status_code == 400 and "kv_budget" in r.text
    assert requests.get(vase_server.url + "/health", timeout=10).status_code == 200


def test_kv_policy_endpoint_reports_config_and_totals(vase_server) -> None:
    greedy(vase_server, 200)
    body = requests.get(vase_server.url + "/kv_policy", timeout=10).json()
    assert body["policy"] == "vase"
    assert body["config"]["budget"] == B and body["config"]["recent"] == R and body["config"]["n_large"] == B // 4
    assert body["totals"]["eviction_rounds"] >= 1
    assert body["totals"]["tokens_evicted"] == R * body["totals"]["eviction_rounds"]


def test_metrics_expose_rounds_and_region_slots(vase_server) -> None:
    greedy(vase_server, 200)
    text = requests.get(vase_server.url + "/metrics", timeout=10).text
    rounds = [float(line.split()[-1]) for line in text.splitlines() if line.startswith("vase:eviction_rounds_total")]
    assert rounds and rounds[0] >= 1
    for name in ("vase:evicted_tokens_total", "vase:round_latency_seconds_bucket", "vase:region_occupancy_ratio_bucket",
                 "vase:reserved_region_slots", "vase:used_region_slots"):
        assert name in text, name


def test_no_leaks_across_finish_and_client_disconnect(vase_server) -> None:
    # Several requests finish; others are cut off mid-stream by their clients.
    def stream_and_drop(n: int) -> int:
        body = {"input_ids": PROMPT + [n], "stream": True,
                "sampling_params": {"max_new_tokens": 800, "temperature": 0.7, "ignore_eos": True}}
        with requests.post(vase_server.url + "/generate", json=body, stream=True, timeout=120) as r:
            chunks = 0
            for line in r.iter_lines():
                if line:
                    chunks += 1
                if chunks >= 250:  # past the first round, then the client goes away
                    break
        return chunks

    with ThreadPoolExecutor(6) as pool:
        finished = [pool.submit(greedy, vase_server, 250, PROMPT + [90 + i]) for i in range(3)]
        dropped = [pool.submit(stream_and_drop, i) for i in range(3)]
        assert all(f.result()["meta_info"]["kv_eviction_rounds"] >= 1 for f in finished)
        assert all(d.result() >= 250 for d in dropped)
    assert wait_idle(vase_server) == 0, "KV slots still in use after every request ended"
    assert requests.get(vase_server.url + "/health", timeout=10).status_code == 200
    log = vase_server.log_text()
    assert "Traceback" not in log and "leak" not in log.lower()


def test_frontend_fork_branches_evict_independently(vase_server) -> None:
    import sglang as sgl

    forks_seen = []

    @sgl.function
    def branches(s):
        s += "The kv cache is a window of recent tokens and"
        forks = s.fork(4)
        for i, f in enumerate(forks):
            f += f" branch {i}:" + sgl.gen("out", max_tokens=260, temperature=0.9, ignore_eos=True)
        forks.join()
        forks_seen.extend(forks)

    backend = sgl.RuntimeEndpoint(vase_server.url)
    branches.run(backend=backend)
    metas = [f.get_meta_info("out") for f in forks_seen]
    assert len(metas) == 4
    assert all(m["kv_eviction_rounds"] >= 2 and m["kv_region_len"] <= REGION for m in metas)
    assert all(m["cached_tokens"] > 0 for m in metas), "branches should share the prompt from the tree"
    texts = {f["out"] for f in forks_seen}
    assert len(texts) == 4, "sampled branches should differ"
    # Each branch ran its own rounds, and none of them touched its prompt's K/V.
    assert all(m["kv_evicted_tokens"] == 32 * m["kv_eviction_rounds"] for m in metas)
    oracle = prefix_digests(vase_server.digest_file)
    assert all(len(oracle[m["id"]]) == 1 + m["kv_eviction_rounds"] for m in metas)
    assert all(len(set(oracle[m["id"]])) == 1 for m in metas)
    time.sleep(0.5)
    assert requests.get(vase_server.url + "/health", timeout=10).status_code == 200
