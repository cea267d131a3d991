"""SGLang's triton attention backend, run on CPU under TRITON_INTERPRET=1, against
torch_native: the query capture must be hooked on it too, not only where CUDA exists
(unhooked, AttnV scores an all-zero query ring on this path and drifts from torch_native
once the rounds start).

The bundled trained model, not the random tiny one: with random weights attention is
nearly uniform and scoring zero queries changes nothing visible.
"""

from __future__ import annotations

import pytest
import requests
from support.e2e import greedy, tokens

pytestmark = pytest.mark.server

B, R, N = 32, 16, 112  # rounds at 48, 64, 80 and 96 generated tokens
ARGS = ("--kv-policy", "vase", "--kv-budget", str(B), "--kv-recent", str(R), "--kv-seed", "3")
LOGPROB_TOL = 2e-3  # same fp32 math in two kernels; an unhooked path is off by up to 0.04


@pytest.fixture(scope="module")
def runs(request: pytest.FixtureRequest, server_dir):
    from support.server import Server
    from transformers import AutoTokenizer

    from vase_sglang.bundled.model import bundled_model_path, chat_prompt
    from vase_sglang.bundled.tasks import ChainTask

    model = bundled_model_path()
    tok = AutoTokenizer.from_pretrained(model)
    ids = tok(chat_prompt(tok, ChainTask().generate(7).prompt), add_special_tokens=False)["input_ids"]
    out = {}
    for backend in ("torch_native", "triton"):
        env = {"TRITON_INTERPRET": "1"} if backend == "triton" else None
        srv = Server(f"backend-{backend}", model, server_dir, *ARGS, "--attention-backend", backend, env=env)
        request.addfinalizer(srv.stop)
        try:
            srv.start(timeout=300)
            out[backend] = (greedy(srv, N, input_ids=ids), requests.get(srv.url + "/kv_policy", timeout=30).json())
        finally:
            srv.stop()  # one server at a time on the two cores
    return out


def test_triton_backend_records_queries(runs) -> None:
    for backend, (gen, policy) in runs.items():
        assert gen["meta_info"]["kv_eviction_rounds"] >= 4, backend
        (rank,) = policy["totals"]["per_rank"]
        assert rank["eviction_rounds"] >= 4 and rank["rounds_without_queries"] == 0, (backend, rank)


def test_triton_backend_matches_torch_native_through_the_rounds(runs) -> None:
    native, triton = runs["torch_native"][0], runs["triton"][0]
    assert tokens(triton) == tokens(native)
    gaps = [abs(a[0] - b[0]) for a, b in zip(native["meta_info"]["output_token_logprobs"],
                                             triton["meta_info"]["output_token_logprobs"], strict=True)]
    assert max(gaps) < LOGPROB_TOL, f"largest log-prob gap {max(gaps):.4f} at token {gaps.index(max(gaps))}"
