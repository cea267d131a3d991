"""Scale-out through the SGLang gateway: vase workers behind smg.

* One server with the whole machine, what a user runs without the cluster, against 2
  workers sharing it behind the gateway (each its core share, as many OpenMP threads and a
  passive wait policy: ``server_process.cpu_share_env``), with cache-aware routing and
  round-robin, on two workloads: 16 shared prefixes x 3 questions (16 tokens each) and 8
  long outputs (200 tokens), 4 clients. The one server is also measured through a
  one-worker gateway, for the gateway's own overhead. Each workload runs 5 times from empty
  radix trees and the median time counts (one run lasts about 1.5 s, and a single one read
  1.86x on a machine where five others read 0.84-0.92x). Two workers must not take more
  than 1.3x the one server's median time on the shared-prefix workload (the long-output
  ratio, which varies widely from run to run on 2 cores, is recorded).
* Prefix hit rates per worker from each worker's own Prometheus counters: cache-aware
  routing must beat round-robin.
* One worker SIGKILLed mid-load, with streaming and non-streaming clients: what the
  requests in flight on it receive is asserted, every request sent after the kill
  succeeds, and the survivor has 0 KV slots in use afterwards.

With ``VASE_RESULTS`` set the figures go to ``gateway/gateway.json`` and
``reliability/killed-worker.json`` (``scripts/reliability.sh``); they are printed either way.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests
from support.constants import VASE_ARGS
from support.e2e import record, wait_idle
from support.server import STRICT_ENV, TEST_FLAGS, Server

from vase_sglang.cluster import Cluster, Gateway, prefix_hit_rate, worker_metrics

pytestmark = pytest.mark.e2e

PREFIXES = [" ".join(f"rule {i} step {j} says keep the value {(i * 7 + j) % 10}." for j in range(30))
            for i in range(16)]
QUESTIONS = ["What is the answer?", "Which value comes last?", "Name the first value."]
MODEL = "vase"  # the served model name: the gateway routes by it
WORKER_ARGS = (*VASE_ARGS, "--max-total-tokens", "16384", "--served-model-name", MODEL, "--enable-metrics")
SCALING_BOUND = 1.3  # two workers on the machine's cores vs one server on all of them
LONG_TOKENS = 200
REPEATS = 5  # runs of each workload per configuration; the median counts


def _complete(url: str, prompt: str, max_tokens: int = 16, timeout: float = 120) -> dict:
    r = requests.post(url + "/v1/completions", timeout=timeout, json={
        "model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True})
    r.raise_for_status()
    return r.json()


def _timed(url: str, jobs: list[tuple[str, int]]) -> float:
    t0 = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda job: _complete(url, *job), jobs))
    return round(time.monotonic() - t0, 2)


def _repeated(url: str, jobs: list[tuple[str, int]], servers: list) -> dict[str, Any]:
    """REPEATS runs of the workload, each from empty radix trees: every run's seconds and
    their median."""
    runs = []
    for _ in range(REPEATS):
        _flush(servers)
        runs.append(_timed(url, jobs))
    return {"seconds": statistics.median(runs), "runs": runs}


WORKLOADS = {
    # Every prefix with each question, questions in turn.
    "shared_prefix": [(p + " " + q, 16) for q in QUESTIONS for p in PREFIXES],
    "long_output": [(f"Story {i}: " + PREFIXES[i][:80], LONG_TOKENS) for i in range(8)],
}


@pytest.fixture(scope="module")
def one_server(tiny_model, tmp_path_factory) -> dict[str, Any]:
    """The workloads on one server with the whole machine, direct and through a gateway.
    Stopped before the cluster starts, so that the two never share the cores."""
    workdir = tmp_path_factory.mktemp("one-server")
    srv = Server("one", tiny_model, workdir, *VASE_ARGS, "--served-model-name", MODEL, "--enable-metrics")
    srv.start()
    gateway = None
    try:
        def from_empty_tree(url: str) -> dict[str, dict[str, Any]]:  # as the cluster's workloads run (_measure)
            return {name: _repeated(url, jobs, [srv]) for name, jobs in WORKLOADS.items()}

        direct = from_empty_tree(srv.url)
        gateway = Gateway([srv.url], "cache_aware", workdir).start()
        through = from_empty_tree(gateway.url)
    finally:
        if gateway is not None:
            gateway.stop()
        srv.stop()
    return {"direct": direct, "through_gateway": through}


@pytest.fixture(scope="module")
def cluster(one_server, tiny_model, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("cluster")
    c = Cluster(str(tiny_model), 2, workdir, [*TEST_FLAGS, *WORKER_ARGS], env=STRICT_ENV)
    c.start()
    yield c
    c.stop()


def _flush(servers: list) -> None:
    """Empty every server's radix tree (SGLang refuses while a request is queued: retry)."""
    for w in servers:
        assert wait_idle(w) == 0
        deadline = time.monotonic() + 60
        while requests.post(w.url + "/flush_cache", timeout=30).status_code != 200:
            assert time.monotonic() < deadline, f"{w.name}: /flush_cache kept refusing"
            time.sleep(0.5)


def _measure(cluster: Cluster, policy: str) -> dict:
    cluster.restart_gateway(policy)
    out: dict[str, Any] = {}
    for name, jobs in WORKLOADS.items():
        before = [worker_metrics(w.url) for w in cluster.workers]
        timing = _repeated(cluster.url, jobs, cluster.workers)
        after = [worker_metrics(w.url) for w in cluster.workers]  # hits over all the runs
        per_worker = [prefix_hit_rate(b, a) for b, a in zip(before, after, strict=True)]
        total = prefix_hit_rate({k: sum(b.get(k, 0) for b in before) for k in after[0]},
                                {k: sum(a.get(k, 0) for a in after) for k in after[0]})
        out[name] = {**timing, "per_worker": per_worker, "overall_hit_rate": total["hit_rate"]}
    return out


def test_two_workers_are_no_slower_than_one_server_and_route_by_prefix(cluster, one_server) -> None:
    aware = _measure(cluster, "cache_aware")
    rr = _measure(cluster, "round_robin")
    one = {name: one_server["direct"][name]["seconds"] for name in WORKLOADS}  # medians
    ratios = {name: {"cache_aware": round(aware[name]["seconds"] / one[name], 2),
                     "round_robin": round(rr[name]["seconds"] / one[name], 2),
                     "gateway_overhead": round(one_server["through_gateway"][name]["seconds"] / one[name], 2)}
              for name in WORKLOADS}
    figures = {"cores": os.cpu_count(), "workers": len(cluster.workers),
               "worker_env": [{k: w.env[k] for k in ("SGLANG_CPU_OMP_THREADS_BIND", "OMP_NUM_THREADS",
                                                     "OMP_WAIT_POLICY")} for w in cluster.workers],
               "workloads": {name: {"requests": len(jobs), "max_tokens": jobs[0][1], "clients": 4,
                                    "repeats": REPEATS}
                             for name, jobs in WORKLOADS.items()},
               "one_server": one_server, "two_workers": {"cache_aware": aware, "round_robin": rr},
               "time_ratio_to_one_server": ratios, "bound": SCALING_BOUND}
    record("gateway/gateway", figures)
    assert all(w["prompt_tokens"] > 0 for w in aware["shared_prefix"]["per_worker"]), "both workers should serve"
    # Round-robin sends each prefix's requests to both workers: each computes it once.
    assert aware["shared_prefix"]["overall_hit_rate"] > rr["shared_prefix"]["overall_hit_rate"], figures
    # Two workers on the machine's cores are no slower than one server on all of them, on
    # the shared-prefix work. On 8 long outputs the ratio ranged from 0.75x to 1.50x over
    # five runs here (both routings), so it is recorded and reported, not bounded.
    assert ratios["shared_prefix"]["cache_aware"] <= SCALING_BOUND, ratios
    assert ratios["shared_prefix"]["round_robin"] <= SCALING_BOUND, ratios


def _client_request(url: str, prompt: str, stream: bool) -> dict[str, Any]:
    """One completion; what the client received: HTTP status, tokens, whether it ended
    normally (a finish_reason, and ``[DONE]`` for a stream), or the exception."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": LONG_TOKENS, "temperature": 0, "ignore_eos": True,
            "stream": stream}
    out: dict[str, Any] = {"stream": stream, "t0": time.monotonic(), "status": None, "chunks": 0, "finished": False,
                           "error": None}
    try:
        with requests.post(url + "/v1/completions", json=body, timeout=120, stream=stream) as r:
            out["status"] = r.status_code
            if not stream:
                choice = r.json()["choices"][0] if r.status_code == 200 else None
                out["finished"] = bool(choice and choice.get("finish_reason") == "length")
                out["error"] = None if r.status_code == 200 else r.text[:200]
            else:
                for line in r.iter_lines():
                    if line == b"data: [DONE]":
                        out["finished"] = True
                    elif line.startswith(b"data: "):
                        out["chunks"] += 1
                        if b'"error"' in line:
                            out["error"] = line[6:206].decode(errors="replace")
    except (requests.RequestException, ValueError) as exc:
        out["error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
    out["t1"] = time.monotonic()
    return out


def test_a_killed_worker_is_routed_around(cluster) -> None:
    """Non-streaming requests in flight on the killed worker are retried by the gateway on
    the survivor and succeed; a stream in flight there cannot be retried once it has sent
    tokens: the client gets HTTP 200, the tokens sent so far, then a data line with an
    error of type ``stream_error`` and ``[DONE]``."""
    cluster.restart_gateway("cache_aware")
    victim, survivor = cluster.workers[1], cluster.workers[0]
    results: list[dict[str, Any]] = []
    lock = threading.Lock()
    stop = threading.Event()

    def client(k: int) -> None:
        i = 0
        while not stop.is_set():
            prompt = PREFIXES[(k * 5 + i) % len(PREFIXES)] + " " + QUESTIONS[i % len(QUESTIONS)]
            outcome = _client_request(cluster.url, prompt, stream=k % 2 == 1)
            with lock:
                results.append(outcome)
            i += 1

    threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    # Kill once the victim has requests running, so that some are surely in flight on it.
    deadline = time.monotonic() + 60
    while (running_on_victim := int(worker_metrics(victim.url).get("sglang:num_running_reqs", 0))) < 1:
        assert time.monotonic() < deadline, "the victim never got a request"
        time.sleep(0.2)
    assert victim.proc is not None and victim.pgid is not None
    killed_at = time.monotonic()
    os.killpg(victim.pgid, signal.SIGKILL)  # the worker and its scheduler, by pid
    time.sleep(15)
    stop.set()
    for t in threads:
        t.join(timeout=150)
    in_flight = [r for r in results if r["t0"] < killed_at < r["t1"]]
    after = [r for r in results if r["t0"] >= killed_at]
    ok = lambda r: r["status"] == 200 and r["finished"] and not r["error"]  # noqa: E731
    figures = {
        "running_on_victim_at_kill": running_on_victim,
        "in_flight": {kind: {"requests": len(rs), "succeeded": sum(map(ok, rs)),
                             "outcomes": sorted({json.dumps({k: r[k] for k in ("status", "finished", "error")})
                                                 for r in rs if not ok(r)})}
                      for kind, rs in (("non_streaming", [r for r in in_flight if not r["stream"]]),
                                       ("streaming", [r for r in in_flight if r["stream"]]))},
        "after_kill": {"requests": len(after), "failed": sum(not ok(r) for r in after)},
    }
    record("reliability/killed-worker", figures)
    assert after, "no request was sent after the kill"
    assert all(map(ok, after)), figures
    assert in_flight, figures
    assert all(ok(r) for r in in_flight if not r["stream"]), figures
    cut = [r for r in in_flight if r["stream"] and not ok(r)]
    assert all(r["status"] == 200 and r["error"] and '"stream_error"' in r["error"] for r in cut), figures
    assert victim.proc.poll() is not None
    assert _complete(cluster.url, PREFIXES[0] + " " + QUESTIONS[0])["choices"][0]["text"]
    assert wait_idle(survivor) == 0
    log = Path(survivor.log_path).read_text(errors="replace")
    assert "Traceback" not in log
