"""SGLang end to end on a GPU without a network: ``--kv-policy none`` against ``vase``, side by side, one call.

On the device tool's H200 (torch 2.11, triton 3.6, no sglang, no network), from the repo root, with the
carry of ``scripts/gpu_e2e/pack`` named in the device tool's ``carry``:

    python3 scripts/gpu_e2e/run.py --out $OUT                    # both arms, Qwen3-8B shape, B=256
    python3 scripts/gpu_e2e/run.py --out $OUT --mode switch      # one vase server, kv_policy per request
                                                                 # (one start-up; a fallback, see SWITCH_NOTE)

Phases, each with its own time limit; a failure records its traceback's tail and the run goes on:

1. install: the carry's wheels into ``--target`` (``pip --no-index --no-deps``), then the environment that
   lets SGLang run without ``sgl_kernel`` and flashinfer (``KIT_ENV``);
2. per arm, one server with identical flags but the policy (random weights from ``--load-format dummy``,
   triton attention, pytorch sampling, no grammar, no tokenizer, prefill graphs off, decode CUDA graphs on,
   overlap off, an equal ``--max-total-tokens`` that holds ``--fits`` full-cache requests): start-up (and its
   CUDA-graph capture time), one greedy request (``vase`` must equal ``none`` before its first round), then
   ``--requests`` streamed requests of ``--prompt-len`` + ``--output-len`` tokens (``ignore_eos``) at once;
3. ratios vase / none.

If an arm cannot start on the Qwen3-8B shape (memory, say), both arms run again on the Qwen3-1.7B shape.
``$OUT/gpu_e2e.json`` is rewritten after every phase; the servers' logs go beside it. ``--device cpu``
runs the same phases on SGLang's CPU engine (the CPU rehearsal, ``tests/tools/test_gpu_e2e_kit.py``).
Exit status: 0 when every check held, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

# SGLang 0.5.23 without sgl_kernel, flashinfer or a network (see docs/gpu.md for why each).
KIT_ENV = {
    "SGLANG_FORCE_FUSED_OP_BACKEND": "torch",      # RMSNorm, SiluAndMul, RoPE: forward_native
    "SGLANG_CRASH_ON_JIT_COMPILE": "1",            # a JIT kernel probe fails fast (torch fallback) instead of nvcc
    "SGLANG_IS_FLASHINFER_AVAILABLE": "false",
    "SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK": "1",   # the stand-in sgl_kernel has no real version
    "TVM_FFI_DISABLE_TORCH_C_DLPACK": "1",         # else tvm_ffi JIT-builds an add-on at import, in every process
    "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND": "python",  # the Rust tree core is a cp311 .so, not carried
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "PYTHONUNBUFFERED": "1",
}

SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-8b": {"hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "tie_word_embeddings": False},
    "qwen3-1.7b": {"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
                   "num_attention_heads": 16, "num_key_value_heads": 8, "tie_word_embeddings": True},
    # For the CPU rehearsal: the same code path in seconds.
    "tiny": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": True},
}
QWEN3_COMMON = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": 128, "vocab_size": 151936,
                "max_position_embeddings": 40960, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
                "hidden_act": "silu", "attention_bias": False, "attention_dropout": 0.0, "use_sliding_window": False,
                "sliding_window": None, "bos_token_id": 151643, "eos_token_id": 151645, "torch_dtype": "bfloat16",
                "initializer_range": 0.02, "use_cache": True}
POOL_SLACK = 64         # tokens added to the pool: the warm-up request and the tree keep a few
SAMPLE_PERIOD_S = 0.2   # /metrics polling: running requests and KV use are gauges
RESERVE_S = 20          # kept back from each phase for writing results and stopping servers
RETRACTED = "sglang:num_retracted_requests_total"
SUMMARY_KEYS = ("completed", "output_tok_s", "running_peak", "running_mean", "retractions", "eviction_rounds",
                "region_max", "ttft_s", "tpot_s", "itl_s", "round_share_of_wall", "gpu_memory_mib_peak")
SWITCH_NOTE = ("one vase server: a request with kv_policy none is admitted under the server's admission clip "
               "(prompt + B + R) like an evicting one and may be retracted later; the arms mode is the fair "
               "comparison of admission")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="scripts/gpu_e2e/run.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add = p.add_argument
    add("--carry", type=Path, default=REPO / ".gpu_e2e", help="the folder scripts/gpu_e2e/pack wrote (.gpu_e2e)")
    add("--out", type=Path, default=Path(os.environ.get("OUT") or "out"), help="results folder (default $OUT)")
    add("--target", type=Path, default=None, help="where the carry is installed (default: a temporary folder)")
    add("--no-install", action="store_true", help="use --target as it is (already installed)")
    add("--install-only", action="store_true", help="install the carry into --target and stop")
    add("--device", choices=("cuda", "cpu"), default="cuda")
    add("--mode", choices=("arms", "switch"), default="arms",
        help="arms: one server per policy; switch: one vase server, kv_policy per request (one start-up)")
    add("--shape", choices=sorted(SHAPES), default="qwen3-8b", help="model shape with random weights (qwen3-8b)")
    add("--fallback-shape", choices=[*sorted(SHAPES), "off"], default="qwen3-1.7b",
        help="shape to retry both arms with when one cannot start (qwen3-1.7b; off: none)")
    add("--model-path", help="serve this model (real weights) instead of a random-weight shape")
    add("--budget", type=int, default=256, metavar="B", help="--kv-budget of vase (256)")
    add("--recent", type=int, default=64, metavar="R", help="--kv-recent of vase (64)")
    add("--prompt-len", type=int, default=128, metavar="P")
    add("--output-len", type=int, default=None, metavar="T", help="output tokens per request (8 * B)")
    add("--fits", type=int, default=8, metavar="K", help="the pool holds K full-cache requests (8)")
    add("--requests", type=int, default=24, metavar="N", help="requests sent at once per arm (24)")
    add("--time-budget", type=float, default=540.0, metavar="S", help="seconds for the whole run (540)")
    add("--startup-timeout", type=float, default=240.0, metavar="S")
    add("--short-phase-timeout", type=float, default=120.0, metavar="S",
        help="limit of the import of sglang and of each greedy request (120)")
    return p


def resolve(st: argparse.Namespace, parser: argparse.ArgumentParser) -> argparse.Namespace:
    if st.budget <= 0 or st.recent <= 0 or st.budget % st.recent:
        parser.error(f"--budget {st.budget} must be a positive multiple of --recent {st.recent}")
    st.output_len = st.output_len or 8 * st.budget
    if st.output_len <= st.budget + st.recent:
        parser.error(f"--output-len {st.output_len} must exceed B + R = {st.budget + st.recent} (no round otherwise)")
    if min(st.prompt_len, st.fits, st.requests) <= 0:
        parser.error("--prompt-len, --fits and --requests must be positive")
    if not st.no_install and not (st.carry / "wheels").is_dir():
        parser.error(f"no carry at {st.carry}: run scripts/gpu_e2e/pack first (and name .gpu_e2e in carry)")
    if st.no_install and st.target is None:
        parser.error("--no-install needs --target")
    st.out = st.out.resolve()
    st.pool = st.fits * (st.prompt_len + st.output_len) + POOL_SLACK
    st.max_running = st.requests + 8
    return st


class Run:
    """The results document, rewritten after every phase; phases run under their own deadlines."""

    def __init__(self, st: argparse.Namespace):
        self.st, self.t0 = st, time.monotonic()
        self.deadline = self.t0 + st.time_budget
        self.share_deadline = self.deadline  # the current server's share of the time left
        st.out.mkdir(parents=True, exist_ok=True)
        self.doc: dict[str, Any] = {
            "kit": "scripts/gpu_e2e/run.py", "command": " ".join([sys.executable, *sys.argv]),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": host_facts(st.device),
            "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(st).items()},
            "phases": [], "runs": [], "checks": {}, "ratios": {},
        }
        self.save()

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def share(self, servers_to_go: int) -> None:
        """Gives the next server an equal share of the time left, so one slow arm cannot starve the next."""
        self.share_deadline = time.monotonic() + self.left() / max(1, servers_to_go)

    def save(self) -> None:
        path = self.st.out / "gpu_e2e.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.doc, indent=2, default=str) + "\n")
        tmp.replace(path)

    def phase(self, name: str, fn: Callable[[float], Any], limit: float) -> tuple[bool, Any]:
        """Runs fn(deadline) if time is left; records ok / seconds / error and saves."""
        budget = min(limit, self.left() - RESERVE_S, self.share_deadline - time.monotonic())
        entry: dict[str, Any] = {"name": name, "ok": False, "limit_s": round(budget, 1)}
        self.doc["phases"].append(entry)
        if budget <= 5:
            entry["error"] = "skipped: no time left"
            self.save()
            return False, None
        start = time.monotonic()
        print(f"[{time.monotonic() - self.t0:6.1f} s] {name} (limit {budget:.0f} s)", flush=True)
        try:
            value = fn(start + budget)
            entry["ok"] = True
            return True, value
        except BaseException as e:  # noqa: BLE001 - record it and go on; Ctrl-C still ends the run below
            entry["error"] = "".join(traceback.format_exception(e))[-3000:]
            print(f"  failed: {type(e).__name__}: {str(e)[-2000:]}", flush=True)
            if isinstance(e, KeyboardInterrupt):
                raise
            return False, None
        finally:
            entry["seconds"] = round(time.monotonic() - start, 1)
            self.save()


def host_facts(device: str) -> dict[str, Any]:
    facts: dict[str, Any] = {"python": sys.version.split()[0], "device": device}
    for mod in ("torch", "triton", "transformers"):
        try:
            facts[mod] = __import__(mod).__version__
        except Exception as e:  # noqa: BLE001 - a fact, not a requirement
            facts[mod] = f"unavailable: {e}"
    if device == "cuda" and shutil.which("nvidia-smi"):
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30)
        facts["gpu"] = q.stdout.strip()
    return facts


def install(st: argparse.Namespace, deadline: float) -> dict[str, Any]:
    """The carry's wheels into the target, which then leads sys.path here and PYTHONPATH in every server."""
    wheels = sorted(str(w) for w in (st.carry / "wheels").glob("*.whl"))
    if not wheels:
        raise RuntimeError(f"no wheels in {st.carry / 'wheels'}")
    st.target.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-index", "--no-deps",
           "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(st.target), *wheels]
    subprocess.run(cmd, check=True, timeout=max(1.0, deadline - time.monotonic()))
    return {"wheels": len(wheels), "target": str(st.target)}


def activate(target: Path) -> None:
    """Makes the installed carry importable here and in every process the servers start."""
    sys.path.insert(0, str(target))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(target), os.environ.get("PYTHONPATH")) if p)
    os.environ.update(KIT_ENV)


def write_model(shape: str, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**QWEN3_COMMON, **SHAPES[shape]}, indent=2))
    return folder


def server_flags(st: argparse.Namespace, policy: str, dummy: bool) -> list[str]:
    flags = ["--grammar-backend", "none", "--skip-tokenizer-init", "--disable-overlap-schedule",
             "--sampling-backend", "pytorch", "--max-total-tokens", str(st.pool),
             "--max-running-requests", str(st.max_running), "--enable-metrics", "--decode-log-interval", "1",
             "--random-seed", "0", "--kv-policy", policy]
    if policy != "none":
        flags += ["--kv-budget", str(st.budget), "--kv-recent", str(st.recent), "--kv-seed", "0"]
    if dummy:
        flags += ["--load-format", "dummy"]
    if st.device == "cuda":  # the CPU engine's flags come from ServerProcess (torch_native, no graphs)
        flags += ["--attention-backend", "triton", "--dtype", "bfloat16", "--cuda-graph-backend-prefill", "disabled",
                  "--cuda-graph-max-bs-decode", str(st.max_running)]
    return flags


STARTUP = re.compile(r"Engine startup timings \(s\): load_weight=([\d.]+), kv_cache_allocation=([\d.]+), "
                     r"scheduler_e2e=([\d.]+), cuda_graph=\{([^}]*)\}")
DECODE_LINE = re.compile(r"Decode batch.*?#running-req: (\d+).*?(cuda|cpu) graph: (True|False)")


def startup_facts(log: str) -> dict[str, Any]:
    m = STARTUP.search(log)
    if not m:
        return {"timings_found": False}
    graphs = dict(kv.split("=") for kv in m.group(4).split(", ") if "=" in kv)
    return {"timings_found": True, "load_weight_s": float(m.group(1)), "kv_cache_allocation_s": float(m.group(2)),
            "scheduler_e2e_s": float(m.group(3)), "cuda_graph_capture_s": {k: float(v) for k, v in graphs.items()},
            "decode_graphs_captured": float(graphs.get("decode", 0)) > 0}


def decode_facts(log: str) -> dict[str, Any]:
    steps = DECODE_LINE.findall(log)
    on_graph = sum(1 for _, _, g in steps if g == "True")
    return {"decode_steps_logged": len(steps), "decode_steps_on_graph": on_graph,
            "decode_graphs_replayed": on_graph > 0}


def prompt_ids(seed: int, n: int, vocab: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(min(1000, vocab // 4), vocab) for _ in range(n)]


def generate(url: str, ids: list[int], max_new: int, custom: dict | None, deadline: float) -> dict:
    import requests

    params: dict[str, Any] = {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True}
    if custom:
        params["custom_params"] = custom
    r = requests.post(url + "/generate", json={"input_ids": ids, "sampling_params": params},
                      timeout=max(1.0, deadline - time.monotonic()))
    r.raise_for_status()
    return r.json()


def stream(url: str, ids: list[int], max_new: int, custom: dict | None, deadline: float) -> dict[str, Any]:
    """One streamed request: token arrival times and the last meta_info."""
    import requests

    params: dict[str, Any] = {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True}
    if custom:
        params["custom_params"] = custom
    start, times, meta, error = time.monotonic(), [], {}, None
    try:
        with requests.post(url + "/generate", json={"input_ids": ids, "sampling_params": params, "stream": True},
                           stream=True, timeout=(30, max(1.0, deadline - start))) as r:
            r.raise_for_status()
            count = 0
            for line in r.iter_lines():
                if time.monotonic() > deadline:
                    error = "deadline passed"
                    break
                if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                meta = chunk.get("meta_info", meta)
                now, n = time.monotonic(), int(meta.get("completion_tokens", count))
                times += [now - start] * (n - count)
                count = n
    except Exception as e:  # noqa: BLE001 - one failed request is a result, not the end of the phase
        error = f"{type(e).__name__}: {e}"[-500:]
    return {"times": times, "meta": meta, "error": error}


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))]


def gpu_memory_mib() -> float | None:
    if not shutil.which("nvidia-smi"):
        return None
    q = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                       capture_output=True, text=True, timeout=10)
    return float(q.stdout.split()[0]) if q.returncode == 0 and q.stdout.strip() else None


def load(st: argparse.Namespace, server: Any, custom: dict | None, deadline: float) -> dict[str, Any]:
    """--requests streamed requests at once; /metrics (and GPU memory) sampled while they run."""
    import requests

    from vase_sglang.bench.serving import scrape

    before, samples, gpu, done = scrape(server.url), [], [], threading.Event()

    def sample() -> None:
        while not done.wait(SAMPLE_PERIOD_S):
            try:
                samples.append(scrape(server.url))
                if st.device == "cuda" and len(samples) % 5 == 0:
                    gpu.append(gpu_memory_mib())
            except (requests.RequestException, ValueError, OSError, subprocess.SubprocessError):
                pass  # a slow scrape: the next one will do

    results: list[dict] = [{}] * st.requests

    def one(i: int) -> None:
        results[i] = stream(server.url, prompt_ids(1000 + i, st.prompt_len, st.vocab), st.output_len, custom, deadline)

    sampler = threading.Thread(target=sample, daemon=True)
    workers = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(st.requests)]
    start = time.monotonic()
    sampler.start()
    for w in workers:
        w.start()
    for w in workers:
        w.join(max(0.0, deadline - time.monotonic()))
    wall = time.monotonic() - start
    done.set()
    sampler.join()
    after = scrape(server.url)
    kv_policy = requests.get(server.url + "/kv_policy", timeout=30).json()
    per_rank = kv_policy.get("totals", {}).get("per_rank", [])
    round_s = max((x.get("round_seconds_total") or 0.0 for x in per_rank), default=0.0)
    complete = [r for r in results if r and not r["error"] and len(r["times"]) == st.output_len]
    ttft = [r["times"][0] for r in complete]
    tpot = [(r["times"][-1] - r["times"][0]) / (len(r["times"]) - 1) for r in complete]
    itl = [b - a for r in complete for a, b in zip(r["times"], r["times"][1:], strict=False)]
    running = [m.get("sglang:num_running_reqs", 0.0) for m in samples]
    busy = [x for x in running if x > 0]
    regions = [int(r["meta"]["kv_region_len"]) for r in results if r and "kv_region_len" in r.get("meta", {})]
    out_tokens = sum(len(r["times"]) for r in results if r)
    return {
        "requests": st.requests, "completed": len(complete),
        "errors": [r.get("error") or f"{len(r.get('times', []))} tokens" for r in results if r not in complete][:10],
        "output_tokens": out_tokens, "wall_s": round(wall, 2), "output_tok_s": out_tokens / wall if wall else None,
        "ttft_s": {"p50": pct(ttft, 50), "p99": pct(ttft, 99)},
        "tpot_s": {"p50": pct(tpot, 50), "p99": pct(tpot, 99)}, "itl_s": {"p50": pct(itl, 50), "p99": pct(itl, 99)},
        "running_peak": int(max(running, default=0)), "running_mean": statistics.fmean(busy) if busy else 0.0,
        "kv_tokens_peak": int(max((m.get("sglang:num_used_tokens", 0.0) for m in samples), default=0)),
        "metrics_samples": len(samples), "retractions": int(after.get(RETRACTED, 0) - before.get(RETRACTED, 0)),
        "max_total_num_tokens": int(after.get("sglang:max_total_num_tokens", 0)),
        "eviction_rounds": kv_policy.get("totals", {}).get("eviction_rounds"),
        "round_seconds_total": round_s, "round_share_of_wall": round_s / wall if wall else None,
        "region_max": max(regions, default=None), "gpu_memory_mib_peak": max((g for g in gpu if g), default=None),
    }


def greedy_length(st: argparse.Namespace) -> int:
    """Past the first round, which comes once the region holds B + R generated tokens."""
    return st.budget + 2 * st.recent


def run_server(run: Run, label: str, model: Path, flags: list[str],
               arms: list[tuple[str, dict | None]]) -> dict[str, Any]:
    """One server: start-up, then per arm (name, custom_params) a greedy request and the load."""
    from vase_sglang.server_process import ServerProcess

    st = run.st
    log = st.out / f"server-{label}.log"
    server = ServerProcess(label, str(model), flags, st.device, log, st.workdir)
    record: dict[str, Any] = {"label": label, "server_cmd": " ".join(server.cmd), "log": log.name, "arms": {}}
    run.doc["runs"].append(record)
    try:
        def start(deadline: float) -> None:
            t = time.monotonic()
            server.launch()
            server.wait_healthy(deadline)
            record["startup_s"] = round(time.monotonic() - t, 1)
            record.update(startup_facts(log.read_text(errors="replace")))
            record["gpu_memory_mib_after_startup"] = gpu_memory_mib() if st.device == "cuda" else None

        ok, _ = run.phase(f"{label}: start-up", start, st.startup_timeout)
        record["started"] = ok
        if not ok:
            record["log_tail"] = server.log_tail(60)
            return record
        for arm, custom in arms:
            res: dict[str, Any] = {}
            record["arms"][arm] = res
            ok, out = run.phase(f"{label}/{arm}: greedy request", lambda d, c=custom: generate(
                server.url, prompt_ids(7, st.prompt_len, st.vocab), greedy_length(st), c, d),
                st.short_phase_timeout)
            if ok:
                res["greedy_output_ids"] = out["output_ids"]
                res["greedy_meta"] = {k: v for k, v in out["meta_info"].items() if k.startswith("kv_")}
            ok, out = run.phase(f"{label}/{arm}: {st.requests} requests x {st.output_len} tokens",
                                lambda d, c=custom: load(st, server, c, d), 420)
            if ok:
                res.update(out)
        record.update(decode_facts(log.read_text(errors="replace")))
        record["alive_at_end"] = server.alive()
    finally:
        server.stop()
        run.save()
    return record


def arm_results(run: Run) -> dict[str, dict]:
    """The last result per arm name (a fallback shape's run replaces the first)."""
    out: dict[str, dict] = {}
    for rec in run.doc["runs"]:
        for arm, res in rec["arms"].items():
            out[arm] = {**res, "server": rec}
    return out


def checks_and_ratios(run: Run) -> None:
    st, arms = run.st, arm_results(run)
    none, vase = arms.get("none", {}), arms.get("vase", {})
    bound = st.budget + st.recent
    checks: dict[str, Any] = {
        "decode_graphs_captured": None if st.device == "cpu" else all(
            r.get("decode_graphs_captured") for r in run.doc["runs"] if r.get("started")) and bool(arms),
        "decode_graphs_replayed": None if st.device == "cpu" else all(
            r.get("decode_graphs_replayed") for r in run.doc["runs"] if r.get("started")) and bool(arms),
    }
    a, b = none.get("greedy_output_ids"), vase.get("greedy_output_ids")
    if a and b:
        first_diff = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        checks["greedy_equal_before_first_round"] = first_diff >= bound
        checks["greedy_first_difference_at"] = first_diff
        checks["greedy_first_round_after"] = bound
    checks["all_requests_completed"] = bool(arms) and all(
        r.get("completed") == st.requests for r in arms.values())
    checks["vase_rounds_run"] = (vase.get("eviction_rounds") or 0) > 0
    checks["vase_region_within_bound"] = vase.get("region_max") is not None and vase["region_max"] <= bound
    checks["vase_region_bound"] = bound
    checks["vase_retractions"] = vase.get("retractions")
    checks["vase_no_retractions"] = vase.get("retractions") == 0
    run.doc["checks"] = checks
    ratio_keys = {"output_tok_s": "output_tok_s", "running_peak": "running_peak", "running_mean": "running_mean"}
    ratios: dict[str, Any] = {}
    for name, key in ratio_keys.items():
        x, y = vase.get(key), none.get(key)
        ratios[f"{name}_vase_over_none"] = x / y if x is not None and y else None
    for name in ("tpot_s", "itl_s"):
        x, y = (vase.get(name) or {}).get("p50"), (none.get(name) or {}).get("p50")
        ratios[f"{name}_p50_vase_over_none"] = x / y if x is not None and y else None
    run.doc["ratios"] = ratios
    run.doc["summary"] = {arm: {**{k: res.get(k) for k in SUMMARY_KEYS},
                                "startup_s": res["server"].get("startup_s")} for arm, res in arms.items()}
    run.save()


def passed(run: Run) -> bool:
    """Every check that applies held (the graph checks do not apply on CPU: they are None there)."""
    return all(v for v in run.doc["checks"].values() if isinstance(v, bool))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    st = resolve(parser.parse_args(argv), parser)
    st.workdir = Path(tempfile.mkdtemp(prefix="vase-gpu-e2e-"))  # servers run outside the checkout
    st.target = st.target or st.workdir / "site"
    run = Run(st)
    try:
        return run_all(run)
    finally:
        shutil.rmtree(st.workdir, ignore_errors=True)


def run_all(run: Run) -> int:
    st = run.st
    if st.no_install:
        activate(st.target)
    else:
        ok, _ = run.phase("install the carry", lambda d: install(st, d), 180)
        if not ok or st.install_only:
            return 0 if ok else 1
        activate(st.target)
    run.doc["host"]["sglang"] = run.phase("import sglang", lambda d: __import__("sglang").__version__,
                                          st.short_phase_timeout)[1]
    shapes = [st.shape] + ([st.fallback_shape] if st.fallback_shape not in ("off", st.shape) else [])
    for shape in shapes if st.model_path is None else ["(model path)"]:
        model = Path(st.model_path).resolve() if st.model_path else write_model(shape, st.workdir / f"model-{shape}")
        st.vocab = int(json.loads((model / "config.json").read_text())["vocab_size"])
        run.doc["shape"] = shape
        tag = shape if st.model_path is None else "model"
        dummy = st.model_path is None
        if st.mode == "arms":
            servers = [(f"{tag}-{p}", p, [(p, None)]) for p in ("none", "vase")]
        else:
            run.doc["mode_note"] = SWITCH_NOTE
            servers = [(f"{tag}-switch", "vase", [("none", {"kv_policy": "none"}), ("vase", {"kv_policy": "vase"})])]
        records = []
        for i, (label, policy, arms) in enumerate(servers):
            run.share(len(servers) - i)
            records.append(run_server(run, label, model, server_flags(st, policy, dummy), arms))
        if all(r.get("started") for r in records):
            break
        print(f"an arm did not start on the {shape} shape" + (", trying the next shape" if shape != shapes[-1] else ""),
              flush=True)
    checks_and_ratios(run)
    run.doc["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    run.doc["wall_s"] = round(time.monotonic() - run.t0, 1)
    run.save()
    print(json.dumps({"checks": run.doc["checks"], "ratios": run.doc["ratios"]}, indent=2), flush=True)
    return 0 if passed(run) else 1


if __name__ == "__main__":
    sys.exit(main())
