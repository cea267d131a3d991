"""Soak test: a server under a mixed Locust load for a long time, memory and slots watched.

    python -m vase_sglang.bench.soak --duration 1800 --max-requests 5000 --out results/soak
    python -m vase_sglang.bench.soak --duration 90 --out /tmp/soak          # the short CI run

It starts the server itself (the bundled model on CPU unless ``--model``; extra server
flags after ``--``), runs ``loadtest/locustfile.py`` headless with every scenario (long
and short outputs, a shared prefix, ``n > 1``, client disconnects mid-stream, per-request
overrides), and samples every few seconds: the RSS of the server's process tree, KV slots
in use, the size of the ``/kv_policy`` payload, and the round-latency figures. Afterwards
it waits for the server to go idle and checks:

* memory flat: RSS at the end at most ``--max-rss-growth-mib`` (default 32 MiB) above RSS
  after the warm-up (the first ``--warmup`` seconds, when allocators and caches fill);
* 0 KV slots in use once idle (no leak), 0 HTTP 5xx, the server never exited;
* the ``/kv_policy`` payload stays the same size (bounded statistics): apart from its
  telemetry tables, which hold one fixed-size entry per (policy, budget) that requests ran
  (a table may gain an entry when a configuration first finishes after the warm-up; it may
  not hold more than MAX_FLEET_CONFIGS, far fewer than a soak's requests).

It writes ``soak.json`` (samples, Locust totals, the eviction telemetry's distributions per
scenario from the responses and the server's own totals from ``/kv_policy``, the verdict)
and ``soak.png`` (memory and slots over time) to ``--out`` and exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import requests

from ..fidelity.outputs import save_png
from ..server_process import ServerProcess

LOCUSTFILE = Path(__file__).resolve().parents[2] / "loadtest" / "locustfile.py"
TAGS = ("long", "prefix", "mix", "n", "abort", "override")
# SGLang's own leak and double-free checks (slower; the CI run turns them on).
# The 30-minute run on the bundled model (results/soak) grew 9.8 MiB after its warm-up, in
# three allocator steps of 3-5 MiB; 32 MiB allows a few more such steps, and a leak of
# 8 KiB per request exceeds it over the run's 4,347 requests (a relative bound of 10 % of
# the 5.5 GB process let 550 MB through).
MAX_RSS_GROWTH_MIB = 32.0
STRICT_CHECKS = {"SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY": "1", "SGLANG_CHECK_KV_PAGE_INVARIANTS": "1"}


def _locustfile(given: str | None) -> Path:
    path = Path(given) if given else LOCUSTFILE
    if path.exists():
        return path
    raise SystemExit(f"{path} not found: run from a checkout, or pass --locustfile loadtest/locustfile.py")


MAX_FLEET_CONFIGS = 32


def _without_config_tables(node: Any) -> tuple[Any, int]:
    """The payload with every telemetry table (``by_config``, and the fleet merge of them
    under ``totals.telemetry``) emptied, and the largest number of entries one held."""
    if isinstance(node, list):
        parts = [_without_config_tables(x) for x in node]
        return [p for p, _ in parts], max((n for _, n in parts), default=0)
    if not isinstance(node, dict):
        return node, 0
    out: dict[str, Any] = {}
    most = 0
    for key, value in node.items():
        if key == "by_config" or (key == "telemetry" and isinstance(value, dict) and "enabled" not in value):
            out[key], most = {}, max(most, len(value) if isinstance(value, dict) else 0)
        else:
            out[key], n = _without_config_tables(value)
            most = max(most, n)
    return out, most


def sample(server: ServerProcess, t0: float) -> dict[str, Any]:
    """One observation of the running server."""
    proc = psutil.Process(server.proc.pid)  # type: ignore[union-attr]
    rss = proc.memory_info().rss + sum(c.memory_info().rss for c in proc.children(recursive=True)
                                       if c.is_running())
    loads = requests.get(server.url + "/v1/loads", params={"include": "core,memory"}, timeout=10).json()
    entries = loads.get("loads", loads)
    entries = entries if isinstance(entries, list) else [entries]
    used = sum(int(e.get("core", e)["num_used_tokens"]) for e in entries)
    payload = requests.get(server.url + "/kv_policy", timeout=10).json()
    ranks = payload.get("totals", {}).get("per_rank") or [{}]
    rest, configs = _without_config_tables(payload)
    return {"t": round(time.monotonic() - t0, 1), "rss_mb": round(rss / 2**20, 1), "used_slots": used,
            "kv_policy_bytes": len(json.dumps(rest)), "kv_policy_configs": configs,
            "rounds": ranks[0].get("eviction_rounds"),
            "round_ms_p50": ranks[0].get("round_latency_ms_p50"), "round_ms_p99": ranks[0].get("round_latency_ms_p99"),
            "tracked_requests": ranks[0].get("tracked_requests")}


def _locust_totals(prefix: Path) -> dict[str, Any]:
    totals: dict[str, Any] = {"requests": 0, "failures": 0, "by_name": {}}
    stats = prefix.with_name(prefix.name + "_stats.csv")
    if stats.exists():
        for row in csv.DictReader(stats.open()):
            if row["Type"] == "chat":
                totals["requests"] += int(row["Request Count"])
                totals["failures"] += int(row["Failure Count"])
                totals["by_name"][row["Name"]] = int(row["Request Count"])
    rows = []
    failures = prefix.with_name(prefix.name + "_failures.csv")
    if failures.exists():
        rows = list(csv.DictReader(failures.open()))
    totals["errors"] = [{"name": r["Name"], "error": r["Error"][:300], "count": int(r["Occurrences"])} for r in rows]
    totals["http_5xx"] = sum(int(r["Occurrences"]) for r in rows
                             if "Error code: 5" in r["Error"] or "InternalServerError" in r["Error"])
    return totals


def telemetry(server: ServerProcess, locust_file: Path) -> dict[str, Any]:
    """The eviction telemetry of the run: the Locust mix's distributions per scenario (from
    the responses) and the server's own totals per policy and budget (``/kv_policy``)."""
    mix = json.loads(locust_file.read_text()) if locust_file.exists() else None
    try:
        fleet = requests.get(server.url + "/kv_policy", timeout=10).json().get("totals", {}).get("telemetry")
    except (requests.RequestException, ValueError):
        fleet = None
    return {"locust_mix": mix, "server_totals": fleet}


def _plot(samples: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 5), sharex=True)
    ax1.plot([s["t"] for s in samples], [s["rss_mb"] for s in samples])
    ax1.set_ylabel("server RSS (MiB)")
    ax2.plot([s["t"] for s in samples], [s["used_slots"] for s in samples])
    ax2.set_ylabel("KV slots in use")
    ax2.set_xlabel("seconds")
    fig.tight_layout()
    save_png(fig, Path(path), dpi=100)  # a palette PNG: a third of the bytes
    plt.close(fig)


def verdict(samples: list[dict], idle: dict, totals: dict, warmup: float, max_growth_mib: float,
            alive: bool) -> dict[str, Any]:
    after_warmup = [s for s in samples if s["t"] >= warmup] or samples
    start, end = after_warmup[0], idle
    growth = end["rss_mb"] - start["rss_mb"]
    checks = {
        "memory_flat": growth <= max_growth_mib,
        "no_leaked_slots": idle["used_slots"] == 0,
        "no_5xx": totals["http_5xx"] == 0,
        "no_crash": alive,
        "kv_policy_payload_bounded": (end["kv_policy_bytes"] <= start["kv_policy_bytes"] + 64
                                      and end.get("kv_policy_configs", 0) <= MAX_FLEET_CONFIGS),
    }
    return {"rss_start_mb": start["rss_mb"], "rss_end_mb": end["rss_mb"], "rss_growth_mib": round(growth, 1),
            "rss_growth": round(growth / start["rss_mb"], 4), "rss_max_growth_mib": max_growth_mib,
            "idle_used_slots": idle["used_slots"],
            "kv_policy_bytes_start": start["kv_policy_bytes"], "kv_policy_bytes_end": end["kv_policy_bytes"],
            "kv_policy_configs_end": end.get("kv_policy_configs"),
            "checks": checks, "pass": all(checks.values())}


def run(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from ..bundled import model as bundled

    model = args.model or str(bundled.bundled_model_path())
    device = "cuda" if args.device == "cuda" else "cpu"
    server = ServerProcess("soak", model, ["--kv-policy", args.kv_policy, *args.server_args], device,
                           out / "server.log", out)
    if args.strict_checks:
        server.env.update(STRICT_CHECKS)
    server.launch()
    samples: list[dict] = []
    stop = threading.Event()
    try:
        server.wait_healthy(time.monotonic() + 300)
        t0 = time.monotonic()

        def watch() -> None:
            while not stop.is_set():
                try:
                    samples.append(sample(server, t0))
                except (requests.RequestException, psutil.Error, ValueError):
                    pass
                stop.wait(args.sample_every)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        prefix = out / "locust"
        locustfile = _locustfile(args.locustfile)
        cmd = [sys.executable, "-m", "locust", "-f", str(locustfile), "--headless", "-u", str(args.users),
               "-r", str(args.users), "-t", f"{args.duration}s", "--host", server.url, "--csv", str(prefix),
               "--only-summary", "--stop-timeout", "60", "--output-len", str(args.output_len),
               "--short-len", str(args.short_len), "--max-requests", str(args.max_requests),
               "--telemetry-out", str(out / "telemetry.json"), "--tags", *TAGS]
        with open(out / "locust.log", "w") as log:
            subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=out, timeout=args.duration + 300)
        stop.set()
        watcher.join(timeout=30)
        deadline = time.monotonic() + 120
        idle = sample(server, t0)
        while idle["used_slots"] and time.monotonic() < deadline:
            time.sleep(1)
            idle = sample(server, t0)
        alive = server.proc is not None and server.proc.poll() is None
        totals = _locust_totals(prefix)
        result = {"command": " ".join(sys.argv), "duration_s": args.duration, "max_requests": args.max_requests,
                  "users": args.users, "locust": totals, "samples": samples, "idle": idle,
                  "telemetry": telemetry(server, out / "telemetry.json"),
                  "verdict": verdict(samples, idle, totals, args.warmup, args.max_rss_growth_mib, alive)}
    finally:
        stop.set()
        server.stop()
    (out / "soak.json").write_text(json.dumps(result, indent=2))
    _plot(samples + [result["idle"]], out / "soak.png")
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m vase_sglang.bench.soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=int, default=1800, help="seconds of load (default 1800)")
    p.add_argument("--max-requests", type=int, default=5000, help="stop after this many requests (default 5000)")
    p.add_argument("--users", type=int, default=8, help="concurrent Locust users (default 8)")
    p.add_argument("--output-len", type=int, default=400, help="tokens of a long request (default 400)")
    p.add_argument("--short-len", type=int, default=24, help="tokens of a short request (default 24)")
    p.add_argument("--warmup", type=float, default=60.0, help="seconds before the memory baseline (default 60)")
    p.add_argument("--max-rss-growth-mib", type=float, default=MAX_RSS_GROWTH_MIB,
                   help=f"allowed RSS growth after warm-up, MiB (default {MAX_RSS_GROWTH_MIB:g})")
    p.add_argument("--sample-every", type=float, default=5.0, help="seconds between samples (default 5)")
    p.add_argument("--model", help="model path (default: the bundled chain-qwen3 model)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--kv-policy", default="vase")
    p.add_argument("--strict-checks", action="store_true", help="run SGLang's leak/double-free checks in the server")
    p.add_argument("--locustfile", help=f"the Locust file (default {LOCUSTFILE})")
    p.add_argument("--out", default="results/soak", help="output folder (default results/soak)")
    p.add_argument("server_args", nargs="*", help="extra server flags, after --")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    v = result["verdict"]
    print(json.dumps({"locust": {k: result["locust"][k] for k in ("requests", "failures", "http_5xx")},
                      "telemetry": (result["telemetry"]["locust_mix"] or {}).get("all"), **v}, indent=1))
    return 0 if v["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
