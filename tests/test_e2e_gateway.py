"""Scale-out through the SGLang gateway (issue 13, part 4): 2 vase workers behind smg.

* cache-aware routing against round-robin, on the same workers and workload (16 shared
  prefixes x 3 questions, 4 clients at a time): prefix hit rate per worker from each
  worker's own Prometheus counters, and the time the workload took against one worker
  alone;
* one worker SIGKILLed mid-load: the requests in flight on it fail with an error, every
  request sent after the kill succeeds (the gateway routes around the dead worker), and
  the survivor has 0 KV slots in use afterwards.

The figures go to ``gateway.json`` in the test's folder and are printed (``-s``).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from conftest import VASE_ARGS
from e2e_helpers import wait_idle
from server import STRICT_ENV, TEST_FLAGS

from vase_sglang.cluster import Cluster, prefix_hit_rate, worker_metrics

pytestmark = pytest.mark.e2e

PREFIXES = [" ".join(f"rule {i} step {j} says keep the value {(i * 7 + j) % 10}." for j in range(30))
            for i in range(16)]
QUESTIONS = ["What is the answer?", "Which value comes last?", "Name the first value."]
REPORT: dict = {}
MODEL = "vase"  # the served model name: the gateway routes by it


@pytest.fixture(scope="module")
def cluster(tiny_model, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("cluster")
    c = Cluster(str(tiny_model), 2, workdir, [*TEST_FLAGS, *VASE_ARGS, "--max-total-tokens", "16384",
                                               "--served-model-name", MODEL], env=STRICT_ENV)
    c.start()
    yield c
    c.stop()
    (workdir / "gateway.json").write_text(json.dumps(REPORT, indent=2))
    print(json.dumps(REPORT, indent=1))


def _complete(url: str, prompt: str, max_tokens: int = 16, timeout: float = 120) -> dict:
    r = requests.post(url + "/v1/completions", timeout=timeout, json={
        "model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True})
    r.raise_for_status()
    return r.json()


def _workload(url: str) -> float:
    """Every prefix with each question, questions in turn; seconds taken."""
    prompts = [p + " " + q for q in QUESTIONS for p in PREFIXES]
    t0 = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda p: _complete(url, p), prompts))
    return time.monotonic() - t0


def _flush(cluster: Cluster) -> None:
    """Empty every worker's radix tree (SGLang refuses while a request is queued: retry)."""
    for w in cluster.workers:
        assert wait_idle(w) == 0
        deadline = time.monotonic() + 60
        while requests.post(w.url + "/flush_cache", timeout=30).status_code != 200:
            assert time.monotonic() < deadline, f"{w.name}: /flush_cache kept refusing"
            time.sleep(0.5)


def _measure(cluster: Cluster, policy: str) -> dict:
    cluster.restart_gateway(policy)
    _flush(cluster)
    before = [worker_metrics(w.url) for w in cluster.workers]
    seconds = _workload(cluster.url)
    after = [worker_metrics(w.url) for w in cluster.workers]
    per_worker = [prefix_hit_rate(b, a) for b, a in zip(before, after, strict=True)]
    total = prefix_hit_rate({k: sum(b.get(k, 0) for b in before) for k in after[0]},
                            {k: sum(a.get(k, 0) for a in after) for k in after[0]})
    return {"seconds": round(seconds, 2), "per_worker": per_worker, "overall_hit_rate": total["hit_rate"]}


def test_cache_aware_routing_keeps_prefixes_on_one_worker(cluster) -> None:
    aware = _measure(cluster, "cache_aware")
    rr = _measure(cluster, "round_robin")
    _flush(cluster)
    one = _workload(cluster.workers[0].url)  # the same workload on one worker, no gateway
    REPORT["routing"] = {"cache_aware": aware, "round_robin": rr, "one_worker_seconds": round(one, 2),
                         "speedup_two_workers_cache_aware": round(one / aware["seconds"], 2)}
    assert all(w["prompt_tokens"] > 0 for w in aware["per_worker"]), "both workers should serve requests"
    # Round-robin sends each prefix's requests to both workers: each computes it once.
    assert aware["overall_hit_rate"] > rr["overall_hit_rate"], REPORT["routing"]


def test_a_killed_worker_is_routed_around(cluster) -> None:
    cluster.restart_gateway("cache_aware")
    victim, survivor = cluster.workers[1], cluster.workers[0]
    results: list[tuple[float, float, int | str]] = []
    lock = threading.Lock()
    stop = threading.Event()

    def client(k: int) -> None:
        i = 0
        while not stop.is_set():
            prompt = PREFIXES[(k * 5 + i) % len(PREFIXES)] + " " + QUESTIONS[i % len(QUESTIONS)]
            t0 = time.monotonic()
            try:
                r = requests.post(cluster.url + "/v1/completions", timeout=120, json={
                    "model": MODEL, "prompt": prompt, "max_tokens": 200, "temperature": 0, "ignore_eos": True})
                outcome: int | str = r.status_code if r.status_code == 200 else f"{r.status_code}: {r.text[:200]}"
            except requests.RequestException as exc:
                outcome = repr(exc)[:200]
            with lock:
                results.append((t0, time.monotonic(), outcome))
            i += 1

    threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    time.sleep(8)
    assert victim.proc is not None and victim.pgid is not None
    killed_at = time.monotonic()
    os.killpg(victim.pgid, signal.SIGKILL)  # the worker and its scheduler, by pid
    time.sleep(15)
    stop.set()
    for t in threads:
        t.join(timeout=150)
    before = [r for r in results if r[0] < killed_at]
    after = [r for r in results if r[0] >= killed_at]
    failed_before = [r for r in before if r[2] != 200]
    failed_after = [r for r in after if r[2] != 200]
    REPORT["killed_worker"] = {"requests_before_kill": len(before), "failed_in_flight": len(failed_before),
                               "requests_after_kill": len(after), "failed_after_kill": len(failed_after),
                               "errors": sorted({str(r[2])[:120] for r in failed_before + failed_after})}
    assert after, "no request was sent after the kill"
    assert not failed_after, REPORT["killed_worker"]
    # A failure must be a request that was running when the worker died, and say so.
    assert all(r[1] >= killed_at and str(r[2]) for r in failed_before), REPORT["killed_worker"]
    assert victim.proc.poll() is not None
    assert _complete(cluster.url, PREFIXES[0] + " " + QUESTIONS[0])["choices"][0]["text"]
    assert wait_idle(survivor) == 0
    log = Path(survivor.log_path).read_text(errors="replace")
    assert "Traceback" not in log
