"""End-to-end memory behaviour: retraction, static admission, frontend fork."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from support.constants import ADMISSION_POOL, PROMPT, REGION, SEED, B, R
from support.e2e import greedy, record, tokens, wait_idle
from support.reference_decode import ReferenceDecoder

pytestmark = pytest.mark.e2e


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
    and must give the same log-probs."""
    import torch
    from transformers import AutoModelForCausalLM

    from vase_sglang.config import PolicyConfig

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
        meta = out["meta_info"]
        reprefills = [int(g) for g in meta["kv_reprefilled_tokens"].split(",")]
        assert meta["kv_region_len"] <= REGION and meta["completion_tokens"] == n_new
        ref = ReferenceDecoder(model, PolicyConfig(policy=policy, budget=B, recent=R), seed=SEED)
        logits = ref.prefill(prompt)
        toks = tokens(out)
        ref_lp, pending = [], list(reprefills)
        for i, token in enumerate(toks):
            ref_lp.append(torch.log_softmax(logits, -1)[token].item())
            if i + 1 == len(toks):  # the server never feeds its last token (nor runs a round for it)
                break
            if pending and pending[0] == i + 1:  # retracted after i + 1 tokens: re-prefilled them
                pending.pop(0)
                logits = ref.reprefill(prompt, toks[: i + 1])
            else:
                logits = ref.step(token)
        assert not pending, f"re-prefill points {reprefills} past the output"
        assert ref.rounds == meta["kv_eviction_rounds"]
        # The reference is bounded the same way, except when a re-prefill produced the last
        # token: then, as on the server, the whole history sits in the region and no decode
        # step follows to run the round that brings it back (kv_region_len is as of the last
        # decode step).
        assert ref.region_length <= REGION or reprefills[-1] == n_new - 1, (ref.region_length, reprefills[-3:])
        server_lp = [lp for lp, _, _ in meta["output_token_logprobs"]]
        diffs = [abs(a - b) for a, b in zip(server_lp, ref_lp, strict=True)]
        worst = max(diffs)
        first = next((i for i, d in enumerate(diffs) if d >= 1e-4), None)
        assert worst < 1e-4, (f"re-prefilled at {reprefills}: max |logprob diff| = {worst}, first at token {first} "
                              f"(diffs from there: {[round(d, 5) for d in diffs[first:first + 8]]}), "
                              f"{meta['kv_eviction_rounds']} rounds")
        worst_by_request.append(worst)
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
