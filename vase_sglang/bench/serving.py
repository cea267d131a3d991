"""Serving benchmark: ``--kv-policy none`` against ``--kv-policy vase`` at an equal KV pool, on SGLang servers.

    python -m vase_sglang.bench.serving                        # tiny model, pools fitting 1x, 2x, 4x requests
    python -m vase_sglang.bench.serving --pools 2x --requests 4 --output-len 512
    python -m vase_sglang.bench.serving --model-path Qwen/Qwen3-8B --kv-budget 2048 --kv-recent 64
    python -m vase_sglang.bench.serving --compare telemetry --rounds 5   # --kv-telemetry off against on
    python -m vase_sglang.bench.serving --baseline snapkv --kv-policy h2o --rounds 3   # the round cost of h2o

Per pool (``--max-total-tokens``, equal for both arms) one server per arm with ``--enable-metrics``, loaded by
``python -m sglang.benchmark.serving`` (N prompts of P token ids at once, T output tokens each): tokens/s and TTFT /
TPOT / ITL from its result; running requests, KV tokens in use and retractions from ``/metrics`` sampled every 0.2 s;
time in eviction rounds from ``GET /kv_policy``. ``--compare`` picks the arms: ``policy`` (``--baseline``, none
by default, against the evicting ``--kv-policy``; two evicting policies also compare their seconds in rounds) or
``telemetry`` (the evicting policy with ``--kv-telemetry off`` against on). With
``--rounds`` K, each round runs every arm back to back on servers that stay up (CPU), the first arm of one
round last in the next, and the ratios are the median of the K per-round ratios: runs seconds apart, not
minutes (a shared machine drifts). Writes
serving_bench.json and .png. Exit status: 0 when every request completed with T tokens, 1 when a server, the
benchmark or a request failed, 2 for bad options.
"""

import argparse
import contextlib
import json
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests
from prometheus_client.parser import text_string_to_metric_families

from ..cli import OneLineParser, positive_float, positive_int
from ..fidelity.outputs import save_png
from ..server_process import ServerError, ServerProcess, stop_all

PROG = "python -m vase_sglang.bench.serving"
COMPARISONS = ("policy", "telemetry")
TELEMETRY_OFF = "-telemetry-off"  # arm name suffix: the evicting policy with --kv-telemetry off
POOL_SLACK = 64  # tokens added to K full requests: the radix tree keeps a little, the warm-ups take a little
SAMPLE_PERIOD_S = 0.2
OWNED_FLAGS = {"--kv-policy", "--kv-budget", "--kv-recent", "--kv-seed", "--max-total-tokens", "--port", "--host",
               "--model-path", "--max-running-requests", "--enable-metrics", "--decode-log-interval", "--kv-telemetry"}
RETRACTED = "sglang:num_retracted_requests_total"  # a counter, absent until the first retraction


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = p.add_argument
    add("--requests", type=positive_int, default=8, metavar="N", help="requests per arm and pool, sent at once (8)")
    add("--output-len", type=positive_int, metavar="T", help="output tokens per request (default 8 * --kv-budget)")
    add("--prompt-len", type=positive_int, default=16, metavar="P", help="prompt tokens per request (16)")
    add("--pools", default="1x,2x,4x", metavar="LIST",
        help=f"--max-total-tokens of both arms, comma-separated: tokens, or Kx = K * (P + T) + {POOL_SLACK}: a pool "
             "where the full cache fits K requests (default 1x,2x,4x)")
    add("--seed", type=int, default=0, help="--seed of SGLang's benchmark: the prompt ids (default 0)")
    add("--kv-budget", type=positive_int, default=128, metavar="B", help="--kv-budget of the vase server (128)")
    add("--kv-recent", type=positive_int, default=32, metavar="R", help="--kv-recent of the vase server (32)")
    add("--kv-seed", type=int, default=None, metavar="S", help="--kv-seed of the vase server (default: per request)")
    add("--kv-policy", default="vase", metavar="P", help="the evicting arm's --kv-policy (vase)")
    add("--compare", choices=COMPARISONS, default="policy",
        help="policy: --baseline against P (default); telemetry: P with --kv-telemetry off against on")
    add("--baseline", default="none", metavar="P",
        help="--compare policy: the baseline arm's --kv-policy (none: the full cache; an evicting policy compares "
             "the round time too)")
    add("--rounds", type=positive_int, default=1, metavar="K",
        help="runs of every arm, back to back per round; ratios are the median over rounds (1)")
    add("--model-path", help="model directory or hub id (default: the tiny random-weight Qwen3 of tiny_model.py)")
    add("--device", choices=["auto", "cpu", "cuda"], default="auto", help="auto: cuda if torch sees a GPU, else cpu")
    add("--max-running-requests", type=positive_int, metavar="M", help="of both arms (default: --requests)")
    add("--server-args", default="", metavar="ARGS", help="more flags for both servers: --server-args='--flag value'")
    add("--startup-timeout", type=positive_float, default=300.0, metavar="S", help="seconds to become healthy (300)")
    add("--out", type=Path, default=None, metavar="DIR", help="output folder (default: a new temporary one)")
    return p


def resolve(st: argparse.Namespace, parser: argparse.ArgumentParser) -> argparse.Namespace:
    """Checks the options together and fills in the defaults, in place; a bad one exits through parser.error."""
    from ..config import PolicyConfig, PolicyConfigError
    from ..plugin.flags import seed_from_flag
    try:
        if PolicyConfig(policy=st.kv_policy, budget=st.kv_budget, recent=st.kv_recent).policy == "none":
            parser.error("invalid --kv-policy none: the compared arm must evict")
        seed_from_flag(st.kv_seed)
        PolicyConfig(policy=st.baseline, budget=st.kv_budget, recent=st.kv_recent)
    except PolicyConfigError as e:
        parser.error(f"--kv-policy/--baseline/--kv-budget/--kv-recent/--kv-seed: {e}")
    if st.compare == "policy" and st.baseline == st.kv_policy:
        parser.error(f"invalid --baseline {st.baseline}: the same policy as --kv-policy")
    if st.compare == "telemetry" and st.baseline != "none":
        parser.error("invalid --baseline with --compare telemetry: the baseline is --kv-policy with --kv-telemetry off")
    st.output_len = st.output_len or 8 * st.kv_budget
    if st.output_len < 2:
        parser.error(f"invalid --output-len {st.output_len}: must be at least 2 (TPOT needs two tokens)")
    per_request, specs = st.prompt_len + st.output_len, st.pools.replace(" ", "").split(",")
    if not all(re.fullmatch(r"[1-9]\d*x?", s) for s in specs):
        parser.error(f"invalid --pools {st.pools!r}: expected comma-separated token counts or multiples like 2x")
    st.pools = list(dict.fromkeys(int(s[:-1]) * per_request + POOL_SLACK if s[-1] == "x" else int(s) for s in specs))
    if small := [p for p in st.pools if p < per_request]:  # the none arm could never finish a request
        parser.error(f"invalid --pools: {small[0]} tokens cannot hold one request of {per_request} tokens")
    try:
        st.server_args = shlex.split(st.server_args)
    except ValueError as e:
        parser.error(f"invalid --server-args {st.server_args!r}: {e}")
    if clash := sorted(OWNED_FLAGS & {a.split("=", 1)[0] for a in st.server_args}):
        parser.error(f"invalid --server-args: {', '.join(clash)} is set by the benchmark itself")
    if st.model_path and Path(st.model_path).is_dir():
        st.model_path = str(Path(st.model_path).resolve())
    elif st.model_path and not re.fullmatch(r"[\w-][\w.-]*/[\w.-]+", st.model_path):  # nor a hub id
        parser.error(f"invalid --model-path {st.model_path!r}: no such directory")
    if st.device == "auto":
        import torch
        st.device = "cuda" if torch.cuda.is_available() else "cpu"
    st.max_running_requests = st.max_running_requests or st.requests
    return st


def reproduce_command(st: argparse.Namespace) -> str:
    cmd = [sys.executable, "-m", "vase_sglang.bench.serving"]
    for key, v in vars(st).items():  # every option, resolved: pools in tokens, the device picked
        if v is not None and v != [] and key != "startup_timeout":
            cmd += ["--" + key.replace("_", "-"), shlex.join(v) if key == "server_args" else
                    ",".join(map(str, v)) if key == "pools" else str(v)]
    return shlex.join(cmd)


def arms(st: argparse.Namespace) -> tuple[str, str]:
    """(baseline, compared): the ratios are compared / baseline."""
    if st.compare == "telemetry":
        return st.kv_policy + TELEMETRY_OFF, st.kv_policy
    return st.baseline, st.kv_policy


def server_args(st: argparse.Namespace, arm: str, pool: int) -> list[str]:
    policy = arm.removesuffix(TELEMETRY_OFF)
    evicting = ["--kv-budget", str(st.kv_budget), "--kv-recent", str(st.kv_recent)]
    evicting += ["--kv-seed", str(st.kv_seed)] if st.kv_seed is not None else []
    evicting += ["--kv-telemetry", "off"] if arm.endswith(TELEMETRY_OFF) else []
    # SGLang publishes its gauges at each decode log line: one per step, so the sampler sees every step.
    return ["--max-total-tokens", str(pool), "--max-running-requests", str(st.max_running_requests), "--enable-metrics",
            "--decode-log-interval", "1", "--kv-policy", policy, *(evicting if policy != "none" else []),
            *st.server_args]


def scrape(url: str) -> dict[str, float]:
    """``GET /metrics``: each ``sglang:`` sample summed over its series (DP ranks), per-priority rows left out."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(requests.get(url + "/metrics", timeout=10).text):
        for s in family.samples:
            if s.name.startswith("sglang:") and not s.labels.get("priority"):
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def sglang_bench(server: ServerProcess, st: argparse.Namespace, result: Path, workdir: Path) -> dict:
    """One batch through ``python -m sglang.benchmark.serving``: its JSON result with per-request details."""
    result.unlink(missing_ok=True)  # SGLang appends to it
    cmd = [sys.executable, "-m", "sglang.benchmark.serving", "--backend", "sglang", "--host", "127.0.0.1",
           "--port", str(server.port), "--dataset-name", "random-ids", "--tokenize-prompt", "--random-input-len",
           str(st.prompt_len), "--random-output-len", str(st.output_len), "--random-range-ratio", "1",
           "--num-prompts", str(st.requests), "--request-rate", "inf", "--seed", str(st.seed),
           "--flush-cache", "--disable-tqdm", "--output-details", "--output-file", str(result)]
    log = result.with_suffix(".log")
    with open(log, "wb") as f:
        rc = subprocess.run(cmd, cwd=workdir, stdout=f, stderr=subprocess.STDOUT).returncode
    lines = result.read_text().splitlines() if result.exists() else []
    if rc != 0 or not lines:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise ServerError(f"sglang.benchmark.serving exited with {rc} against {server.name}; log {log}:\n{tail}")
    return json.loads(lines[-1])


def _round_seconds(kv_policy: dict) -> float | None:
    """Seconds in eviction rounds since the server started: ranks evict in parallel, so the
    slowest rank's rounds are what the batch waited for."""
    per_rank = kv_policy.get("totals", {}).get("per_rank", [])
    return max((x["round_seconds_total"] for x in per_rank if x.get("round_seconds_total") is not None),
               default=None)


def measure(server: ServerProcess, arm: str, pool: int, st: argparse.Namespace, logs: Path, workdir: Path,
            round_index: int = 0) -> dict:
    before, samples, done = scrape(server.url), [], threading.Event()
    rounds_before = _round_seconds(requests.get(server.url + "/kv_policy", timeout=30).json())

    def sample() -> None:  # running requests and KV tokens in use are gauges: only polling sees their peaks
        while not done.wait(SAMPLE_PERIOD_S):
            with contextlib.suppress(requests.RequestException, ValueError):  # a slow scrape: the next will do
                samples.append(scrape(server.url))
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    result = logs / (f"sglang-bench-{arm}-{pool}" + (f"-round{round_index}" if st.rounds > 1 else "") + ".jsonl")
    try:
        b = sglang_bench(server, st, result, workdir)
    finally:
        done.set()
        sampler.join()
    after, kv_policy = scrape(server.url), requests.get(server.url + "/kv_policy", timeout=30).json()
    bad = [f"request {k}: {e[-300:] or f'short output: {n} tokens'}"
           for k, (n, e) in enumerate(zip(b["output_lens"], b["errors"], strict=True)) if e or n != st.output_len]
    running = [m.get("sglang:num_running_reqs", 0.0) for m in samples]
    busy = [r for r in running if r > 0]  # the samples while the server had work
    per_rank = kv_policy.get("totals", {}).get("per_rank", [])
    secs = _round_seconds(kv_policy)
    # This batch's rounds: a server kept up through several rounds has run earlier ones.
    run_secs = secs - (rounds_before or 0.0) if secs is not None else None
    telemetry_secs = [float(t["seconds_total"]) for t in (x.get("telemetry") or {} for x in per_rank)
                      if t.get("seconds_total") is not None]
    telemetry = max(telemetry_secs, default=None)
    n = {"ttft": b["completed"], "tpot": sum(x > 1 for x in b["output_lens"]), "itl": sum(map(len, b["itls"]))}
    return {
        "arm": arm, "pool": pool, "round": round_index,
        "max_total_num_tokens": int(after.get("sglang:max_total_num_tokens", 0)),
        "requests": st.requests, "completed": st.requests - len(bad), "errors": len(bad), "error_messages": bad,
        "output_tokens": b["total_output_tokens"], "wall_s": b["duration"], "output_tok_s": b["output_throughput"],
        "running_peak": int(max(running, default=0)), "running_mean": sum(busy) / max(len(busy), 1),
        "kv_tokens_peak": int(max((m.get("sglang:num_used_tokens", 0.0) for m in samples), default=0)),
        "metrics_samples": len(samples), "retractions": int(after.get(RETRACTED, 0) - before.get(RETRACTED, 0)),
        **{f"{k}_s": {"p50": b[f"median_{k}_ms"] / 1e3, "p99": b[f"p99_{k}_ms"] / 1e3, "n": n[k]} for k in n},
        # The round cost in the same run as the decode steps it interrupts (each server runs one batch).
        "kv_policy_state": kv_policy, "round_seconds_total": secs, "round_seconds": run_secs,
        "round_share_of_wall": run_secs / b["duration"] if run_secs is not None else None,
        # The telemetry's own host seconds since the server started (per_rank's seconds_total).
        "telemetry_seconds_total": telemetry,
        "output_lens": b["output_lens"], "sglang_bench_result": str(result),
        "server_cmd": shlex.join(server.cmd), "server_log": str(server.log_path), "server_pid": server.pgid,
    }


RATIO_KEYS = {"throughput": lambda r: r["output_tok_s"], "peak_running": lambda r: r["running_peak"],
              "tpot_p50": lambda r: r["tpot_s"]["p50"], "itl_p50": lambda r: r["itl_s"]["p50"],
              # Seconds in this batch's eviction rounds (the same rounds at one budget): the
              # per-round cost of two evicting policies; None against the full cache.
              "round_seconds": lambda r: r.get("round_seconds")}


def ratios(results: list[dict], pair: tuple[str, str] = ("none", "vase")) -> list[dict]:
    """compared / baseline at each pool where both arms ran: output tokens/s, peak running
    requests, TPOT and ITL medians; with several rounds, each round's ratio and their median."""
    base, other = pair
    by = {(r["pool"], r["arm"], r.get("round", 0)): r for r in results}
    out = []
    for pool in dict.fromkeys(r["pool"] for r in results):
        rounds = [k for k in sorted({r.get("round", 0) for r in results}) if (pool, base, k) in by
                  and (pool, other, k) in by]
        if not rounds:
            continue
        row: dict = {"pool": pool, "rounds": len(rounds)}
        for name, get in RATIO_KEYS.items():
            per_round = [get(by[pool, other, k]) / get(by[pool, base, k])
                         if get(by[pool, base, k]) and get(by[pool, other, k]) is not None else None for k in rounds]
            valid = [x for x in per_round if x is not None]
            row[f"{name}_{other}_over_{base}"] = statistics.median(valid) if valid else None
            if len(rounds) > 1:
                row[f"{name}_per_round"] = per_round
        out.append(row)
    return out


def _f(x: float | None, fmt: str, scale: float = 1.0) -> str:
    return "-" if x is None else format(x * scale, fmt)


def format_table(results: list[dict], st: argparse.Namespace) -> str:
    base, other = arms(st)
    rat = {r["pool"]: r for r in ratios(results, (base, other))}
    rows = [["pool", "fits", "round", "arm", "done/err", "out tok/s", f"x {base}", "peak run", f"x {base}", "mean run",
             "retract", "peak KV", "round %", "TTFT p50/p99 s", "TPOT p50/p99 ms", "ITL p50/p99 ms"]]
    for r in results:
        x = rat.get(r["pool"]) if r["arm"] == other and st.rounds == 1 else None
        rows.append([str(r["pool"]), f"{(r['pool'] - POOL_SLACK) / (st.prompt_len + st.output_len):.1f}",
                     str(r.get("round", 0)), r["arm"], f"{r['completed']}/{r['errors']}", _f(r["output_tok_s"], ".1f"),
                     _f(x[f"throughput_{other}_over_{base}"], ".2f") + "x" if x else "", str(r["running_peak"]),
                     _f(x[f"peak_running_{other}_over_{base}"], ".2f") + "x" if x else "", _f(r["running_mean"], ".2f"),
                     str(r["retractions"]), str(r["kv_tokens_peak"]), _f(r["round_share_of_wall"], ".1f", 100)]
                    + [f"{_f(r[k]['p50'], f, s)}/{_f(r[k]['p99'], f, s)}"
                       for k, f, s in (("ttft_s", ".3f", 1), ("tpot_s", ".2f", 1e3), ("itl_s", ".2f", 1e3))])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    medians = [f"pool {r['pool']}: median over {r['rounds']} rounds of {other} / {base}: "
               + ", ".join(f"{name} {_f(r[f'{name}_{other}_over_{base}'], '.3f')}x" for name in RATIO_KEYS)
               for r in rat.values()]
    return "\n".join(["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in rows] + medians + [
        f"fits: full-cache requests; x {base}: {other} / {base} at one pool; run, KV, retract: /metrics; "
        "round %: of wall"])


def write_plot(results: list[dict], path: Path, pair: tuple[str, str]) -> str | None:
    """Writes the PNG; returns why it was skipped, or None."""
    try:
        import matplotlib.pyplot as plt  # falls back to Agg without a display
    except ImportError:
        return "matplotlib is not installed: no plot written (pip install matplotlib to get serving_bench.png)"
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, label in zip(axes, ("output_tok_s", "running_peak"), ("output tokens/s", "peak running"), strict=True):
        for arm, marker in zip(pair, "os", strict=True):
            rs = sorted((r for r in results if r["arm"] == arm), key=lambda r: (r["pool"], r.get("round", 0)))
            ax.plot([r["pool"] for r in rs], [r[key] or 0 for r in rs], marker=marker, linestyle="none",
                    label=arm)
        ax.set(xlabel="KV pool (--max-total-tokens)", ylabel=label, ylim=(0, None))
        ax.legend()
    save_png(fig, Path(path), dpi=120, bbox_inches="tight")  # a palette PNG: a third of the bytes
    plt.close(fig)
    return None


def bench_pool(st: argparse.Namespace, model: str, pool: int, logs: Path, workdir: Path, results: list[dict]) -> None:
    """Both arms at one pool: on CPU started together (start-up dominates) and kept up through every round
    (each round runs the arms back to back); on a GPU one server at a time (memory), all its rounds at once."""
    pair = arms(st)
    servers = [ServerProcess(f"{arm} (pool {pool})", model, server_args(st, arm, pool), st.device,
                             logs / f"server-{arm}-{pool}.log", workdir) for arm in pair]
    together = st.device == "cpu"
    # Rounds alternate which arm runs first (ABBA), so an advantage of running first or
    # second in a round cancels out of the median.
    order = ([(k, i) for k in range(st.rounds) for i in (range(len(pair)) if k % 2 == 0 else
                                                          reversed(range(len(pair))))] if together
             else [(k, i) for i in range(len(pair)) for k in range(st.rounds)])
    try:
        for k, i in order:
            arm, server = pair[i], servers[i]
            starting = [s for s in (servers if together else [server]) if s.proc is None]
            for s in starting:
                s.launch()
            for s in starting:
                s.wait_healthy(time.monotonic() + st.startup_timeout)
            r = measure(server, arm, pool, st, logs, workdir, k)
            print(f"[pool {pool}{f', round {k}' if st.rounds > 1 else ''}] {arm}: {r['completed']}/{r['requests']} "
                  f"done, {r['output_tok_s']:.1f} out tok/s, TPOT p50 {1e3 * r['tpot_s']['p50']:.2f} ms, "
                  f"peak {r['running_peak']} running, {r['retractions']} retractions, wall {r['wall_s']:.1f} s",
                  flush=True)
            results.append(r)
            if not together and k == st.rounds - 1:
                server.stop()
    finally:  # also on an error or SIGTERM: every server runs in its own process group, nothing else ends it
        stop_all(servers)


def run(st: argparse.Namespace) -> int:
    out = (st.out or Path(tempfile.mkdtemp(prefix="vase-serving-bench-"))).resolve()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="vase-serving-bench-work-"))  # cwd of servers and client, tiny model
    command, results, failures = reproduce_command(st), [], []  # type: str, list[dict], list[str]
    print(f"{PROG}: pools {st.pools}, {st.requests} x {st.prompt_len} + {st.output_len} tokens; out {out}", flush=True)
    try:
        model = st.model_path
        if model is None:
            from ..bundled.tiny_model import build_tiny_qwen3
            model = str(build_tiny_qwen3(scratch / "tiny-qwen3"))
        for pool in st.pools:
            bench_pool(st, model, pool, out / "logs", scratch, results)
    except (ServerError, requests.RequestException, ValueError) as e:  # ValueError: a reply that is not JSON
        failures.append(f"{type(e).__name__}: {e}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    failures += [f"{r['arm']} pool {r['pool']} {m}" for r in results for m in r["error_messages"]]
    failures += [f"{r['arm']} server at pool {r['pool']} sized its pool to {r['max_total_num_tokens']}"
                 for r in results if r["max_total_num_tokens"] != r["pool"]]
    plot = out / "serving_bench.png"
    skipped = write_plot(results, plot, arms(st)) if results else "no results to plot"
    doc = {"benchmark": "vase_sglang.bench.serving", "command": command, "pool_slack": POOL_SLACK,
           "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(st).items()},
           "arms": list(arms(st)), "results": results, "ratios": ratios(results, arms(st)), "failures": failures,
           "plot": None if skipped else str(plot), "plot_skipped": skipped}
    (out / "serving_bench.json").write_text(json.dumps(doc, indent=2) + "\n")
    print("\n" + format_table(results, st) if results else "")
    print(f"\nwrote {out / 'serving_bench.json'}" + (f"\n{skipped}" if skipped else f" and {plot}"))
    print(f"reproduce: {command}")
    for f in failures[:20]:
        print(f"{PROG}: error: {f}", file=sys.stderr)
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    st = resolve(parser.parse_args(argv), parser)
    # SIGTERM unwinds through bench_pool()'s finally, which stops the servers: each is in its own process group.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    return run(st)


if __name__ == "__main__":
    sys.exit(main())
