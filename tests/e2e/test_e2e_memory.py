"""End-to-end memory behaviour: retraction, static admission, frontend fork."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from support.constants import ADMISSION_POOL, PROMPT, REGION
from support.e2e import assert_matches_reference, greedy, record, wait_idle

pytestmark = pytest.mark.server


def test_no_leaks_across_retraction(retract_server) -> None:
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda i: greedy(retract_server, 300, PROMPT + [70 + i]), range(4)))
    metas = [o["meta_info"] for o in outs]
    assert sum(m["num_retractions"] for m in metas) > 0, "SGLANG_TEST_RETRACT should have retracted requests"
    assert all(m["completion_tokens"] == 300 for m in metas)
    assert all(m["kv_region_len"] <= REGION for m in metas)
    assert wait_idle(retract_server) == 0
    log = retract_server.log_text()
    assert "Testing retraction" in log
    assert "Traceback" not in log and "leak" not in log.lower()


@pytest.mark.parametrize("policy", ["vase", "h2o", "gkv", "tova"])
def test_a_retracted_request_is_evicted_back_to_its_budget_and_matches_the_reference(retract_server, tiny_model,
                                                                                      policy: str) -> None:
    """After a retraction the re-prefilled history is the request's region, not a protected
    prefix: the tree takes only the prompt, and the first round after the re-prefill brings
    the region back to B. A stateful policy's scores start again from nothing then (the
    queries that earned them are gone).
    The reference loop re-prefills at the same points (meta_info ``kv_reprefilled_tokens``)
    and must give the same log-probs. Requests that were not retracted are not compared:
    see test_e2e_triton_kernels' docstring for why their value-range ties can break
    differently."""
    import torch
    from transformers import AutoModelForCausalLM

    n_new = 360  # rounds before and after the retractions
    prompts = [PROMPT + [90 + i] for i in range(4)]
    extra = {} if policy == "vase" else {"custom_params": {"kv_policy": policy}}
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda p: greedy(retract_server, n_new, p, **extra), prompts))
    retracted = [(p, o) for p, o in zip(prompts, outs, strict=True) if o["meta_info"]["kv_reprefilled_tokens"]]
    assert retracted, "SGLANG_TEST_RETRACT should have retracted a request past its first tokens"
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    worst_by_request = []
    for prompt, out in retracted:
        assert out["meta_info"]["completion_tokens"] == n_new
        worst_by_request.append(assert_matches_reference(model, policy, prompt, out))
    assert wait_idle(retract_server) == 0
    if policy != "vase":
        return
    record("reliability/retraction", {
        "requests": len(prompts), "tokens_each": n_new, "retracted_requests": len(retracted),
        "reprefills": [len(o["meta_info"]["kv_reprefilled_tokens"].split(",")) for _, o in retracted],
        "region_len_max": max(o["meta_info"]["kv_region_len"] for _, o in retracted), "region_bound": REGION,
        "max_abs_logprob_diff_to_reference": max(worst_by_request), "slots_in_use_after": 0})


def test_static_admission_runs_four_times_the_full_cache_batch(admission_server) -> None:
    """Full cache fits 2 requests of 1,000 generated tokens in this pool; vase runs 8 at once."""
    prompt_len = len(PROMPT) + 1
    assert 2 * (prompt_len + 1000) <= ADMISSION_POOL < 3 * (prompt_len + 1000)
    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(lambda i: greedy(admission_server, 1000, PROMPT + [100 + i]), range(8)))
    metas = [o["meta_info"] for o in outs]
    assert all(m["completion_tokens"] == 1000 for m in metas)
    assert all(m["num_retractions"] == 0 for m in metas)
    log = admission_server.log_text()
    running = [int(x) for x in re.findall(r"Decode batch.*?#running-req: (\d+)", log)]
    assert running and max(running) >= 8, f"peak running requests {max(running, default=0)}"
    assert "Retract requests" not in log
    assert wait_idle(admission_server) == 0


def test_long_generation_is_not_cut_to_the_pool_size(admission_server) -> None:
    """Stock SGLang clips max_new_tokens to what the pool holds (~2,140 here); an evicting
    request only needs prompt + B + R slots, so it generates all it asked for."""
    out = greedy(admission_server, 3000)
    meta = out["meta_info"]
    assert meta["completion_tokens"] == 3000 and meta["finish_reason"]["type"] == "length"
    assert meta["kv_region_len"] <= REGION
    assert wait_idle(admission_server) == 0
