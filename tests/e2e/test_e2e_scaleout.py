"""Scale-out on the CPU engine: ``--dp-size 2`` with vase (each DP rank is a scheduler
with its own pool; eviction is local to it). ``--tp 2`` does not run on SGLang's CPU
engine here (stock SGLang fails in PyNcclCommunicator: "Expected a cuda device, but
got: cpu"), see docs/scale-out.md."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest
import requests
from support.constants import PROMPT, REGION, VASE_ARGS
from support.e2e import greedy, wait_idle
from support.server import ServerConfig, shared_server

pytestmark = pytest.mark.server


@shared_server
def dp_server(tiny_model, server_dir) -> ServerConfig:
    # One CPU core per rank; SGLang asks for an explicit binding with more ranks than NUMA nodes.
    return ServerConfig("dp2", (*VASE_ARGS, "--dp-size", "2"), env={"SGLANG_CPU_OMP_THREADS_BIND": "0|1"})


def test_data_parallel_ranks_each_evict(dp_server) -> None:
    with ThreadPoolExecutor(4) as pool:
        metas = [o["meta_info"] for o in pool.map(lambda i: greedy(dp_server, 300, PROMPT + [i]), range(4))]
    assert {m["dp_rank"] for m in metas} == {0, 1}
    assert all(m["kv_eviction_rounds"] >= 1 and m["kv_region_len"] <= REGION for m in metas)
    totals = requests.get(dp_server.url + "/kv_policy", timeout=30).json()["totals"]
    assert len(totals["per_rank"]) == 2 and all(r["eviction_rounds"] >= 1 for r in totals["per_rank"])
    assert totals["eviction_rounds"] == sum(m["kv_eviction_rounds"] for m in metas)
    assert wait_idle(dp_server) == 0


def test_an_idle_data_parallel_controller_leaves_the_cores_to_the_engine(dp_server) -> None:
    """SGLang's controller loop polls its socket without blocking (a core busy while idle);
    patches/cpu_engine.py's waits on it: over 5 idle seconds the controller uses well under
    a tenth of a core, and still routes a request at once."""
    assert dp_server.proc is not None
    controller = next(p for p in psutil.Process(dp_server.proc.pid).children(recursive=True)
                      if "data_parallel_controller" in " ".join(p.cmdline()) or p.name().startswith("sglang::data"))
    before = sum(controller.cpu_times()[:2])
    time.sleep(5)
    used = sum(controller.cpu_times()[:2]) - before
    assert used < 0.5, f"the idle controller used {used:.2f} CPU seconds in 5 s"
    assert greedy(dp_server, 8)["meta_info"]["completion_tokens"] == 8
