"""Scale out: N vase-sglang workers behind the Shepherd Model Gateway (PyPI ``smg``).

    python -m vase_sglang.cluster --workers 2                     # CPU, the bundled model
    python -m vase_sglang.cluster --workers 4 --device cuda --model Qwen/Qwen3-8B -- --kv-budget 4096
    scripts/serve_cluster.sh 2                                    # the same, from a checkout

Each worker is a full SGLang server with ``--kv-policy`` (its own radix tree, KV pool and
eviction); the gateway in front routes each request, with ``--policy cache_aware`` by
default, to the worker whose tree already holds the longest prefix of it, so shared
prefixes stay on one worker. It health-checks the workers and routes around one that
dies. Ctrl-C (or SIGTERM) stops the gateway and every worker, by pid.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import requests

from .server_process import ServerError, ServerProcess, free_port, group_alive, keep_priority

GATEWAY_POLICIES = ("cache_aware", "round_robin", "random", "power_of_two", "least_load", "prefix_hash")


class Gateway:
    """``python -m smg launch`` in its own process group."""

    def __init__(self, worker_urls: list[str], policy: str, workdir: Path, port: int | None = None,
                 metrics_port: int | None = None):
        self.port = port or free_port()
        self.metrics_port = metrics_port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / f"gateway-{policy}-{self.port}.log"
        self.cmd = [sys.executable, "-m", "smg", "launch", "--host", "127.0.0.1", "--port", str(self.port),
                    "--worker-urls", *worker_urls, "--policy", policy,
                    # smg's metrics listener defaults to port 29000 whatever --port is: a second
                    # gateway on the machine would fail to bind it and exit.
                    "--prometheus-host", "127.0.0.1", "--prometheus-port", str(self.metrics_port),
                    # Notice a dead worker within about a second; SGLang workers answer /health.
                    "--health-check-interval-secs", "1", "--health-failure-threshold", "1",
                    "--health-check-endpoint", "/health", "--log-level", "info"]
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60.0) -> Gateway:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, preexec_fn=keep_priority())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(f"gateway exited with status {self.proc.returncode}: {self.log_path}")
            try:
                if requests.get(self.url + "/v1/models", timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.3)
        self.stop()
        raise ServerError(f"gateway not ready after {timeout:.0f} s: {self.log_path}")

    def stop(self) -> None:
        if self.proc is None:
            return
        pgid = self.proc.pid
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if self.proc.poll() is None or group_alive(pgid):
                try:
                    os.killpg(pgid, sig)
                except ProcessLookupError:
                    pass
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass


class Cluster:
    """N workers and one gateway; ``stop()`` ends them all, by pid."""

    def __init__(self, model: str, n_workers: int, workdir: Path, worker_args: list[str], device: str = "cpu",
                 policy: str = "cache_aware", env: dict[str, str] | None = None):
        self.workdir = workdir
        self.workers = [ServerProcess(f"worker{i}", model, ["--enable-metrics", *worker_args], device,
                                      workdir / f"worker{i}.log", workdir) for i in range(n_workers)]
        for i, w in enumerate(self.workers):
            w.env.update(env or {})
            if device == "cpu" and n_workers > 1:
                w.share_cpu(i, n_workers)
        self.policy = policy
        self.gateway: Gateway | None = None

    @property
    def url(self) -> str:
        assert self.gateway is not None
        return self.gateway.url

    def start(self, timeout: float = 300.0, gateway_port: int | None = None,
              metrics_port: int | None = None) -> Cluster:
        try:
            for w in self.workers:
                w.launch()
            deadline = time.monotonic() + timeout
            for w in self.workers:
                w.wait_healthy(deadline)
            self.gateway = Gateway([w.url for w in self.workers], self.policy, self.workdir, gateway_port,
                                   metrics_port).start()
        except BaseException:
            self.stop()
            raise
        return self

    def restart_gateway(self, policy: str) -> None:
        if self.gateway is not None:
            self.gateway.stop()
        self.policy = policy
        self.gateway = Gateway([w.url for w in self.workers], policy, self.workdir).start()

    def stop(self) -> None:
        if self.gateway is not None:
            self.gateway.stop()
        for w in self.workers:
            w.stop()


def worker_metrics(url: str) -> dict[str, float]:
    """Sums of a worker's Prometheus counters (``sglang:*``), over their label sets."""
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(url + "/metrics", timeout=10).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def prefix_hit_rate(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """Cached prompt tokens / prompt tokens between two ``worker_metrics`` readings."""
    prompt = after.get("sglang:prompt_tokens_total", 0.0) - before.get("sglang:prompt_tokens_total", 0.0)
    cached = after.get("sglang:cached_tokens_total", 0.0) - before.get("sglang:cached_tokens_total", 0.0)
    return {"prompt_tokens": int(prompt), "cached_tokens": int(cached),
            "hit_rate": round(cached / prompt, 4) if prompt else None}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m vase_sglang.cluster", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=2, help="number of workers (default 2)")
    p.add_argument("--policy", choices=GATEWAY_POLICIES, default="cache_aware", help="gateway routing policy")
    p.add_argument("--kv-policy", default="vase", help="each worker's --kv-policy (default vase)")
    p.add_argument("--model", help="model path (default: the bundled chain-qwen3 model)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--port", type=int, default=30000, help="the gateway's port (default 30000)")
    p.add_argument("--metrics-port", type=int, default=29000,
                   help="the gateway's Prometheus /metrics port (default 29000, smg's own)")
    p.add_argument("--served-model-name", default="vase",
                   help="the model name clients send; the gateway routes by it (default vase)")
    p.add_argument("--workdir", default="cluster-logs", help="where the logs go (default ./cluster-logs)")
    p.add_argument("worker_args", nargs="*", help="extra worker flags, after --")
    args = p.parse_args(argv)
    if args.workers < 1:
        p.error("--workers must be >= 1")
    from .bundled.model import bundled_model_path

    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(args.model or str(bundled_model_path()), args.workers, workdir,
                      ["--kv-policy", args.kv_policy, "--served-model-name", args.served_model_name,
                       *args.worker_args], args.device, args.policy)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        cluster.start(gateway_port=args.port, metrics_port=args.metrics_port)
        for w in cluster.workers:
            print(f"worker {w.name}: {w.url} (pid {w.proc.pid if w.proc else '?'}, log {w.log_path})", flush=True)
        gw = cluster.gateway
        assert gw is not None and gw.proc is not None
        print(f"gateway ({args.policy}): {gw.url} (pid {gw.proc.pid}, metrics http://127.0.0.1:{gw.metrics_port}"
              f"/metrics, log {gw.log_path}); Ctrl-C stops everything",
              flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
