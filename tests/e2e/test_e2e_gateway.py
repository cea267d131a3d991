"""Scale-out through the SGLang gateway: vase workers behind smg.

* One server with the whole machine, what a user runs without the cluster, against 2
  workers sharing it behind the gateway (each its core share, as many OpenMP threads and a
  passive wait policy: ``server_process.cpu_share_env``), with cache-aware routing and
  round-robin, on two workloads: 16 shared prefixes x 3 questions (16 tokens each) and 8
  long outputs (200 tokens; only when ``VASE_RESULTS`` is set), 4 clients. The one server is also measured through a
  one-worker gateway, for the gateway's own overhead. All of them are up at once (an idle
  server uses about 4 % of a core) and each round runs every configuration back to back,
  from empty radix trees, so that the ratio of a round compares runs made seconds apart:
  this machine's speed drifts by 20-40 % over minutes (the same server, same work, read
  1.48 s and 1.83 s ten minutes apart), which made ratios of runs minutes apart read up to
  1.53x on work where back-to-back runs read 0.9x. Two workers must not take more than 1.3x
  the one server's time, as the median over 5 rounds of the per-round ratio, on the
  shared-prefix workload (the long-output ratio, which varies widely on 2 cores, is
  recorded).
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

import psutil
import pytest
import requests
from support.constants import VASE_ARGS
from support.e2e import record, wait_idle
from support.server import STRICT_ENV, TEST_FLAGS, Server

from vase_sglang.cluster import Cluster, Gateway, prefix_hit_rate, worker_metrics

pytestmark = pytest.mark.server

PREFIXES = [" ".join(f"rule {i} step {j} says keep the value {(i * 7 + j) % 10}." for j in range(30))
            for i in range(16)]
QUESTIONS = ["What is the answer?", "Which value comes last?", "Name the first value."]
MODEL = "vase"  # the served model name: the gateway routes by it
WORKER_ARGS = (*VASE_ARGS, "--max-total-tokens", "16384", "--served-model-name", MODEL, "--enable-metrics")
SCALING_BOUND = 1.3  # two workers on the machine's cores vs one server on all of them
LONG_TOKENS = 200
REPEATS = 5  # rounds; each runs every workload on every configuration once


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


WORKLOADS = {
    # Every prefix with each question, questions in turn.
    "shared_prefix": [(p + " " + q, 16) for q in QUESTIONS for p in PREFIXES],
    "long_output": [(f"Story {i}: " + PREFIXES[i][:80], LONG_TOKENS) for i in range(8)],
}
# The long-output ratio is recorded, never bounded (see the test), so it is measured only when
# the figures are written (``VASE_RESULTS``, scripts/reliability.sh): it is most of the time.
MEASURED = tuple(WORKLOADS) if os.environ.get("VASE_RESULTS") else ("shared_prefix",)


@pytest.fixture(scope="module")
def cluster(tiny_model, tmp_path_factory):
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


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its children so far."""
    proc = psutil.Process(pid)
    return sum(t.user + t.system for t in (p.cpu_times() for p in [proc, *proc.children(recursive=True)]))


class Config:
    """One way to serve the workloads: a URL, the servers behind it, and what its runs measured."""

    def __init__(self, url: str, servers: list, gateway: Gateway | None = None):
        self.url, self.servers, self.gateway = url, servers, gateway
        self.runs: dict[str, list[float]] = {name: [] for name in WORKLOADS}
        # Prompt and cached tokens per server, summed over the runs (the counters are cumulative
        # and another configuration may share these servers between runs).
        self.tokens = {name: [{"prompt_tokens": 0, "cached_tokens": 0} for _ in servers] for name in WORKLOADS}
        self.gateway_cpu_seconds = 0.0

    def run(self, workload: str) -> None:
        """One run of the workload from empty radix trees."""
        _flush(self.servers)
        before = [worker_metrics(w.url) for w in self.servers]
        gateway_pid = self.gateway.proc.pid if self.gateway and self.gateway.proc else None
        cpu0 = _cpu_seconds(gateway_pid) if gateway_pid else 0.0
        self.runs[workload].append(_timed(self.url, WORKLOADS[workload]))
        if gateway_pid:
            self.gateway_cpu_seconds += _cpu_seconds(gateway_pid) - cpu0
        for sums, b, w in zip(self.tokens[workload], before, self.servers, strict=True):
            hits = prefix_hit_rate(b, worker_metrics(w.url))
            for key in sums:
                sums[key] += hits[key]

    def figures(self, workload: str) -> dict[str, Any]:
        """Every run's seconds, their median, and prefix hit rates per server and overall."""
        def rate(prompt: int, cached: int) -> float | None:
            return round(cached / prompt, 4) if prompt else None

        per_server = [{**t, "hit_rate": rate(t["prompt_tokens"], t["cached_tokens"])} for t in self.tokens[workload]]
        return {"seconds": statistics.median(self.runs[workload]), "runs": self.runs[workload],
                "per_worker": per_server,
                "overall_hit_rate": rate(sum(t["prompt_tokens"] for t in per_server),
                                         sum(t["cached_tokens"] for t in per_server))}


def _interleaved(configs: dict[str, Config]) -> None:
    """REPEATS rounds; each runs every workload on every configuration, back to back."""
    for _ in range(REPEATS):
        for workload in MEASURED:
            for config in configs.values():
                config.run(workload)


def test_two_workers_are_no_slower_than_one_server_and_route_by_prefix(cluster, tiny_model, tmp_path) -> None:
    one = Server("one", tiny_model, tmp_path, *VASE_ARGS, "--served-model-name", MODEL, "--enable-metrics")
    gateways: list[Gateway] = []
    try:
        one.start()
        one_gateway = Gateway([one.url], "cache_aware", tmp_path).start()
        gateways.append(one_gateway)
        cluster.restart_gateway("cache_aware")
        round_robin = Gateway([w.url for w in cluster.workers], "round_robin", tmp_path).start()
        gateways.append(round_robin)
        configs = {"one_server": Config(one.url, [one]),
                   "one_server_through_gateway": Config(one_gateway.url, [one], one_gateway),
                   "cache_aware": Config(cluster.url, cluster.workers, cluster.gateway),
                   "round_robin": Config(round_robin.url, cluster.workers, round_robin)}
        _interleaved(configs)
    finally:
        for gw in gateways:
            gw.stop()
        one.stop()
    base = configs["one_server"].runs

    def ratio(name: str, workload: str) -> dict[str, Any]:
        per_round = [round(t / b, 2) for t, b in zip(configs[name].runs[workload], base[workload], strict=True)]
        return {"median": statistics.median(per_round), "rounds": per_round}

    ratios = {workload: {"cache_aware": ratio("cache_aware", workload), "round_robin": ratio("round_robin", workload),
                         "gateway_overhead": ratio("one_server_through_gateway", workload)}
              for workload in MEASURED}
    results = {name: {"gateway_cpu_seconds": round(c.gateway_cpu_seconds, 2) if c.gateway else None,
                      **{workload: c.figures(workload) for workload in MEASURED}}
               for name, c in configs.items()}
    figures = {"cores": os.cpu_count(), "workers": len(cluster.workers),
               "worker_env": [{k: w.env[k] for k in ("SGLANG_CPU_OMP_THREADS_BIND", "OMP_NUM_THREADS",
                                                     "OMP_WAIT_POLICY")} for w in cluster.workers],
               "workloads": {name: {"requests": len(jobs), "max_tokens": jobs[0][1], "clients": 4,
                                    "rounds": REPEATS}
                             for name, jobs in WORKLOADS.items() if name in MEASURED},
               "configurations": results, "time_ratio_to_one_server": ratios, "bound": SCALING_BOUND}
    record("gateway/gateway", figures)
    aware, rr = results["cache_aware"]["shared_prefix"], results["round_robin"]["shared_prefix"]
    assert all(w["prompt_tokens"] > 0 for w in aware["per_worker"]), "both workers should serve"
    # Round-robin sends each prefix's requests to both workers: each computes it once.
    assert aware["overall_hit_rate"] > rr["overall_hit_rate"], figures
    # Two workers on the machine's cores are no slower than one server on all of them, on
    # the shared-prefix work. On 8 long outputs the ratio ranged from 0.75x to 1.50x over
    # five runs here (both routings), so it is recorded and reported, not bounded.
    assert ratios["shared_prefix"]["cache_aware"]["median"] <= SCALING_BOUND, ratios
    assert ratios["shared_prefix"]["round_robin"]["median"] <= SCALING_BOUND, ratios


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
    """Non-streaming requests in flight when a worker is SIGKILLed all succeed (on the
    survivor, or retried there by the gateway); a stream cut on the dead worker after it
    sent tokens cannot be retried: the client gets HTTP 200, the tokens sent so far, then a
    data line with an error of type ``stream_error`` and ``[DONE]``."""
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
