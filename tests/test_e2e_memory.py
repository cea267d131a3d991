"""End-to-end memory behaviour: retraction, static admission, frontend fork (issue 3)."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import ADMISSION_POOL
from e2e_helpers import PROMPT, REGION, greedy, wait_idle

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
