"""The server's eviction through the Triton kernels (the GPU code path), run by the
Triton interpreter inside the CPU engine, against the reference decode loop.

Every other end-to-end test serves with the kernels' torch twins (what a CPU server
uses). Here ``VASE_KERNEL_BACKEND=triton`` makes the server score, select, compact and
carry scores with the Triton kernels, and ``SGLANG_TEST_RETRACT`` retracts a running
request every 50 forwards, so a request crosses ordinary rounds, re-prefills and the
rounds that follow them. It must give the log-probs of the reference loop running the
same kernels.

Only retracted requests are compared, as in test_e2e_memory. The request that stays
runs one decode step in a smaller batch each time the other is retracted; the CPU
engine's matmuls round differently at another batch size, and this random-weight model
repeats tokens, whose first-layer values are exact ties in the value-range reservation
only while they were computed at the same batch size. The retracted request is
re-prefilled before the next decode step and never decodes in the smaller batch.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from support.constants import PROMPT
from support.e2e import assert_matches_reference, greedy, wait_idle

pytestmark = pytest.mark.server

N_NEW = 300  # five rounds, and re-prefills before and after the first


def test_the_server_uses_the_triton_kernels(triton_kernel_server) -> None:
    greedy(triton_kernel_server, 8)
    assert "VaSE kernels: using the triton backend for cpu tensors (forced)" in triton_kernel_server.log_text()


@pytest.mark.parametrize("policy", ["vase", "h2o", "gkv", "tova"])
def test_triton_kernels_match_the_reference_across_retractions(triton_kernel_server, tiny_model,
                                                               policy: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    prompts = [PROMPT + [110 + i] for i in range(2)]
    extra = {} if policy == "vase" else {"custom_params": {"kv_policy": policy}}
    with ThreadPoolExecutor(2) as pool:
        outs = list(pool.map(lambda p: greedy(triton_kernel_server, N_NEW, p, **extra), prompts))
    for out in outs:
        meta = out["meta_info"]
        assert meta["kv_policy"] == policy and meta["completion_tokens"] == N_NEW
        assert meta["kv_eviction_rounds"] >= 5
    retracted = [(p, o) for p, o in zip(prompts, outs, strict=True) if o["meta_info"]["kv_reprefilled_tokens"]]
    assert retracted, "SGLANG_TEST_RETRACT should have retracted a request past its first tokens"
    assert any(len(o["meta_info"]["kv_reprefilled_tokens"].split(",")) >= 3 for _, o in retracted)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    for prompt, out in retracted:
        assert_matches_reference(model, policy, prompt, out, backend="triton")
    assert wait_idle(triton_kernel_server) == 0
