"""Serving benchmark: ``--kv-policy none`` against ``--kv-policy vase`` on real SGLang servers.

    python -m vase_sglang.bench.serving                        # tiny model, pools fitting 1x, 2x, 4x
    python -m vase_sglang.bench.serving --pools 2x,4x --requests 4
    python -m vase_sglang.bench.serving --model-path Qwen/Qwen3-8B --kv-budget 2048 --kv-recent 64

For every KV pool size (``--max-total-tokens``, the same for both arms) it starts one
SGLang server per arm, sends N concurrent long requests at once (short distinct prompts
of token ids, a fixed output length through ``ignore_eos``), streamed through the native
``/generate`` endpoint, and measures:

* output tokens/s: all output tokens / wall time of the batch (first send to last token);
* running requests per decode step, peak and mean, and the peak KV slots in use
  (``#token``), from the server's ``Decode batch`` log lines (``--decode-log-interval``);
* retractions: the sum of ``meta_info.num_retractions`` and the ``Retract requests`` log lines;
* TTFT (send to first streamed chunk), TPOT ((e2e - TTFT) / (output tokens - 1)) and ITL
  (gaps between streamed chunks), p50 and p99 over the batch;
* requests completed with the full output length, and errors.

It prints a table with vase/none ratios for throughput and peak concurrency of the same
run, writes ``serving_bench.json`` (and ``serving_bench.png`` when matplotlib is
installed) to ``--out``, the server logs beside them, and prints the command that
reproduces the run.

Device: ``auto`` uses CUDA when torch sees a GPU; otherwise SGLang's CPU engine
(``SGLANG_USE_CPU_ENGINE=1 --device cpu --attention-backend torch_native
--disable-cuda-graph --mem-fraction-static 0.1 --dtype float32 --sleep-on-idle``). On CPU
the two servers of one pool are started together (start-up is most of the time there)
and benchmarked one after the other while the other one sleeps on idle. Every server
runs in its own process group, outside any source checkout, and is stopped by it.

Exit status: 0 when every request of every arm completed, 1 when a server failed or a
request failed or came back short, 2 for bad options.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..cli import OneLineParser, positive_float, positive_int
from ..server_process import ServerError, ServerProcess, stop_all

PROG = "python -m vase_sglang.bench.serving"
ARMS = ("none", "vase")
POOL_SLACK = 64  # tokens added to K full requests: the radix tree keeps a little, the warm-up takes a little

DECODE_RE = re.compile(r"Decode batch\b.*?#running-req: (\d+)")
TOKEN_RE = re.compile(r"#(?:full )?token: (\d+)")
QUEUE_RE = re.compile(r"#queue-req: (\d+)")
RETRACTED_RE = re.compile(r"#retracted_reqs: (\d+)")


class OptionError(Exception):
    """A bad command-line option (exit status 2)."""


# ---- options ------------------------------------------------------------------------------

def _pool_specs(text: str) -> list[str]:
    specs = [s.strip() for s in text.split(",")]
    if not specs or any(not re.fullmatch(r"[1-9]\d*x?", s) for s in specs):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated token counts or multiples like 2x (full requests), got {text!r}")
    return specs


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    w = p.add_argument_group("workload")
    w.add_argument("--requests", type=positive_int, default=8, metavar="N",
                   help="concurrent requests per arm and pool, all sent at once (default 8)")
    w.add_argument("--output-len", type=positive_int, default=None, metavar="T",
                   help="output tokens per request, fixed with ignore_eos (default 8 * --kv-budget; at least 2)")
    w.add_argument("--prompt-len", type=positive_int, default=16, metavar="P",
                   help="prompt tokens per request: distinct seeded token ids (default 16)")
    w.add_argument("--pools", type=_pool_specs, default=["1x", "2x", "4x"], metavar="LIST",
                   help="KV pool sizes (--max-total-tokens of both arms), comma-separated: a token count, or "
                        f"Kx for K * (prompt + output) + {POOL_SLACK}, a pool where the full cache fits about K "
                        "requests (default 1x,2x,4x)")
    w.add_argument("--seed", type=int, default=0, help="seed of the prompt token ids (default 0)")
    v = p.add_argument_group("vase arm")
    v.add_argument("--kv-budget", type=positive_int, default=128, metavar="B",
                   help="--kv-budget of the vase server (default 128, sized for CPU)")
    v.add_argument("--kv-recent", type=positive_int, default=32, metavar="R",
                   help="--kv-recent of the vase server; B must be a multiple of R (default 32)")
    v.add_argument("--kv-seed", type=int, default=0, metavar="S", help="--kv-seed of the vase server (default 0)")
    s = p.add_argument_group("servers")
    s.add_argument("--model-path", default=None,
                   help="model directory or hub id (default: build the tiny random-weight Qwen3 of "
                        "vase_sglang.tiny_model into a temporary folder)")
    s.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: cuda when torch.cuda.is_available(), else SGLang's CPU engine with the CPU flags "
                        "(default auto)")
    s.add_argument("--max-running-requests", type=positive_int, default=None, metavar="M",
                   help="--max-running-requests of both arms (default: --requests)")
    s.add_argument("--decode-log-interval", type=positive_int, default=1, metavar="K",
                   help="--decode-log-interval of both arms; running requests and KV slots are read from these "
                        "log lines (default 1: every decode step)")
    s.add_argument("--paired-start", action=argparse.BooleanOptionalAction, default=None,
                   help="start the none and vase servers of a pool together, then benchmark them one after the "
                        "other (default: on for cpu, off for cuda, where two servers would share one GPU's memory "
                        "at start-up)")
    s.add_argument("--server-args", default="", metavar="ARGS",
                   help="extra arguments for both servers, one shell-quoted string, e.g. "
                        "--server-args='--attention-backend triton' (with '=' when it starts with '-')")
    s.add_argument("--startup-timeout", type=positive_float, default=300.0, metavar="S",
                   help="seconds to wait for a server to become healthy (default 300)")
    s.add_argument("--request-timeout", type=positive_float, default=1800.0, metavar="S",
                   help="seconds one streamed request may take in all (default 1800)")
    o = p.add_argument_group("output")
    o.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help="folder for serving_bench.json, serving_bench.png and the server logs "
                        "(default: a new temporary folder, printed)")
    return p


@dataclass
class Settings:
    requests: int
    output_len: int
    prompt_len: int
    pools: list[int]
    pool_specs: list[str]
    seed: int
    kv_budget: int
    kv_recent: int
    kv_seed: int
    model_path: str | None
    device: str
    max_running_requests: int
    decode_log_interval: int
    paired_start: bool
    server_args: list[str]
    startup_timeout: float
    request_timeout: float
    out: Path | None


def _model_config(model_path: str | None) -> dict:
    if model_path is None:
        return {"vocab_size": 512, "max_position_embeddings": 4096}  # vase_sglang.tiny_model
    cfg = Path(model_path) / "config.json"
    try:
        return json.loads(cfg.read_text())
    except (OSError, ValueError):
        return {}


def resolve(args: argparse.Namespace) -> Settings:
    """Checks the options together and fills in the defaults; raises OptionError."""
    from ..config import PolicyConfig, PolicyConfigError

    try:
        PolicyConfig(policy="vase", budget=args.kv_budget, recent=args.kv_recent, seed=args.kv_seed)
    except PolicyConfigError as e:
        raise OptionError(f"--kv-budget/--kv-recent/--kv-seed: {e}") from None
    output_len = args.output_len if args.output_len is not None else 8 * args.kv_budget
    if output_len < 2:
        raise OptionError(f"invalid --output-len {output_len}: must be at least 2 (TPOT needs two tokens)")
    per_request = args.prompt_len + output_len

    if args.model_path is not None:
        mp = args.model_path
        looks_like_hub_id = re.fullmatch(r"[\w.-]+/[\w.-]+", mp) is not None and not mp.startswith(".")
        if not os.path.exists(mp) and not looks_like_hub_id:
            raise OptionError(f"invalid --model-path {mp!r}: no such directory")
        if os.path.exists(mp) and not os.path.isdir(mp):
            raise OptionError(f"invalid --model-path {mp!r}: not a directory")
        if os.path.isdir(mp):
            args.model_path = str(Path(mp).resolve())
    cfg = _model_config(args.model_path)
    ctx = cfg.get("max_position_embeddings")
    if isinstance(ctx, int) and per_request > ctx:
        raise OptionError(f"--prompt-len {args.prompt_len} + --output-len {output_len} = {per_request} tokens "
                          f"exceeds the model's context length {ctx}")

    pools = []
    for spec in args.pools:
        pool = int(spec[:-1]) * per_request + POOL_SLACK if spec.endswith("x") else int(spec)
        if pool < per_request:
            raise OptionError(f"invalid --pools entry {spec}: {pool} tokens cannot hold one request of "
                              f"{args.prompt_len} + {output_len} = {per_request} tokens (the none arm could never "
                              f"finish it)")
        if pool in pools:
            raise OptionError(f"invalid --pools: {pool} tokens given twice")
        pools.append(pool)

    device = args.device
    if device != "cpu":
        import torch

        has_cuda = torch.cuda.is_available()
        if device == "cuda" and not has_cuda:
            raise OptionError("--device cuda: torch.cuda.is_available() is False on this machine")
        device = "cuda" if has_cuda else "cpu"
    try:
        server_args = shlex.split(args.server_args)
    except ValueError as e:
        raise OptionError(f"invalid --server-args {args.server_args!r}: {e}") from None
    owned = {"--kv-policy", "--kv-budget", "--kv-recent", "--kv-seed", "--max-total-tokens", "--port", "--host",
             "--model-path", "--max-running-requests", "--decode-log-interval"}
    clash = sorted(owned & {a.split("=", 1)[0] for a in server_args})
    if clash:
        raise OptionError(f"invalid --server-args: {', '.join(clash)} is set by the benchmark itself")
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        raise OptionError(f"invalid --out {str(args.out)!r}: exists and is not a directory")
    return Settings(
        requests=args.requests, output_len=output_len, prompt_len=args.prompt_len, pools=pools,
        pool_specs=list(args.pools), seed=args.seed, kv_budget=args.kv_budget, kv_recent=args.kv_recent,
        kv_seed=args.kv_seed, model_path=args.model_path, device=device,
        max_running_requests=args.max_running_requests or args.requests,
        decode_log_interval=args.decode_log_interval,
        paired_start=(device == "cpu") if args.paired_start is None else args.paired_start,
        server_args=server_args, startup_timeout=args.startup_timeout, request_timeout=args.request_timeout,
        out=args.out,
    )


def reproduce_command(st: Settings) -> str:
    cmd = [sys.executable, "-m", "vase_sglang.bench.serving"]
    if st.model_path is not None:
        cmd += ["--model-path", st.model_path]
    cmd += ["--device", st.device, "--pools", ",".join(map(str, st.pools)), "--requests", str(st.requests),
            "--output-len", str(st.output_len), "--prompt-len", str(st.prompt_len), "--seed", str(st.seed),
            "--kv-budget", str(st.kv_budget), "--kv-recent", str(st.kv_recent), "--kv-seed", str(st.kv_seed),
            "--max-running-requests", str(st.max_running_requests),
            "--decode-log-interval", str(st.decode_log_interval),
            "--paired-start" if st.paired_start else "--no-paired-start"]
    if st.server_args:
        cmd += ["--server-args", shlex.join(st.server_args)]
    if st.out is not None:
        cmd += ["--out", str(st.out)]
    return shlex.join(cmd)


# ---- servers ------------------------------------------------------------------------------

class Server(ServerProcess):
    """One benchmark arm (none or vase) at one pool size."""

    def __init__(self, st: Settings, model: str, arm: str, pool: int, logdir: Path, workdir: Path):
        self.arm, self.pool = arm, pool
        args = ["--max-total-tokens", str(pool), "--max-running-requests", str(st.max_running_requests),
                "--decode-log-interval", str(st.decode_log_interval), "--log-level", "info"]
        if arm == "vase":
            args += ["--kv-policy", "vase", "--kv-budget", str(st.kv_budget), "--kv-recent", str(st.kv_recent),
                     "--kv-seed", str(st.kv_seed)]
        else:
            args += ["--kv-policy", "none"]
        super().__init__(f"{arm} (pool {pool})", model, args + list(st.server_args), st.device,
                         logdir / f"server-{arm}-{pool}.log", workdir)

    def loads(self) -> dict:
        import requests

        try:
            body = requests.get(self.url + "/v1/loads", params={"include": "core"}, timeout=10).json()
            loads = body.get("loads", body)
            return loads[0] if isinstance(loads, list) and loads else {}
        except (requests.RequestException, ValueError):
            return {}

    def kv_policy(self) -> dict | None:
        """``GET /kv_policy`` of the plugin (configuration, eviction rounds, round latency), or None."""
        import requests

        try:
            r = requests.get(self.url + "/kv_policy", timeout=30)
            return r.json() if r.status_code == 200 else None
        except (requests.RequestException, ValueError):
            return None


# ---- one batch ----------------------------------------------------------------------------

@dataclass
class RequestResult:
    index: int
    prompt_tokens: int = 0
    output_tokens: int = 0
    finish_reason: str | None = None
    retractions: int = 0
    kv_evicted_tokens: int | None = None
    t_send: float = 0.0
    ttft_s: float | None = None
    e2e_s: float | None = None
    chunk_gaps_s: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.e2e_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


def prompts(st: Settings) -> list[list[int]]:
    import random

    vocab = _model_config(st.model_path).get("vocab_size") or 32000
    lo, hi = (3, vocab) if vocab < 1000 else (100, min(vocab, 30000))  # clear of special tokens
    seen, out = set(), []
    for i in range(st.requests):
        rng = random.Random(st.seed * 1_000_003 + i)
        ids = [rng.randrange(lo, hi) for _ in range(st.prompt_len)]
        while tuple(ids) in seen:  # distinct prompts (only matters for tiny --prompt-len)
            ids[-1] = rng.randrange(lo, hi)
        seen.add(tuple(ids))
        out.append(ids)
    return out


def _stream_one(url: str, index: int, ids: list[int], st: Settings, start: threading.Event) -> RequestResult:
    import httpx

    res = RequestResult(index=index)
    body = {"input_ids": ids, "stream": True,
            "sampling_params": {"max_new_tokens": st.output_len, "ignore_eos": True, "temperature": 0}}
    timeout = httpx.Timeout(st.request_timeout, connect=30.0)
    start.wait()
    last_n, last_t, meta = 0, None, {}
    try:
        with httpx.Client(timeout=timeout) as client:
            res.t_send = time.perf_counter()
            with client.stream("POST", url + "/generate", json=body) as r:
                if r.status_code != 200:
                    res.error = f"HTTP {r.status_code}: {r.read().decode(errors='replace')[:300]}"
                    return res
                for line in r.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        break
                    now = time.perf_counter()
                    obj = json.loads(payload)
                    if "error" in obj:
                        res.error = f"server error: {json.dumps(obj['error'])[:300]}"
                        return res
                    meta = obj.get("meta_info", {})
                    n = int(meta.get("completion_tokens", 0))
                    if n > last_n:
                        if last_t is None:
                            res.ttft_s = now - res.t_send
                        else:
                            res.chunk_gaps_s.append(now - last_t)
                        last_n, last_t = n, now
        res.e2e_s = (last_t - res.t_send) if last_t is not None else None
    except (httpx.HTTPError, ValueError, OSError) as e:
        res.error = f"{type(e).__name__}: {e}"
    res.output_tokens = last_n
    res.prompt_tokens = int(meta.get("prompt_tokens", 0))
    res.retractions = int(meta.get("num_retractions", 0) or 0)
    fr = meta.get("finish_reason")
    res.finish_reason = fr.get("type") if isinstance(fr, dict) else fr
    if meta.get("kv_evicted_tokens") is not None:
        res.kv_evicted_tokens = int(meta["kv_evicted_tokens"])
    if res.error is None and res.output_tokens != st.output_len:
        res.error = f"short output: {res.output_tokens} of {st.output_len} tokens (finish {res.finish_reason})"
    return res


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    import numpy as np

    return float(np.percentile(np.asarray(values, dtype=float), q))


def _summary(values: list[float]) -> dict:
    return {"p50": _pct(values, 50), "p99": _pct(values, 99),
            "mean": (sum(values) / len(values)) if values else None, "n": len(values)}


def parse_log(text: str) -> dict:
    running, tokens, queue = [], [], []
    retract_lines = retracted = 0
    for line in text.splitlines():
        if "Decode batch" in line:
            m = DECODE_RE.search(line)
            if m:
                running.append(int(m.group(1)))
                t = TOKEN_RE.search(line)
                if t:
                    tokens.append(int(t.group(1)))
                q = QUEUE_RE.search(line)
                if q:
                    queue.append(int(q.group(1)))
        if "Retract requests" in line:
            retract_lines += 1
            m = RETRACTED_RE.search(line)
            retracted += int(m.group(1)) if m else 0
    return {
        "decode_log_lines": len(running),
        "running_peak": max(running, default=0),
        "running_mean": (sum(running) / len(running)) if running else 0.0,
        "kv_tokens_peak": max(tokens, default=0),
        "queue_peak": max(queue, default=0),
        "retract_log_lines": retract_lines,
        "retracted_reqs_log": retracted,
    }


def run_batch(server: Server, st: Settings, ids: list[list[int]]) -> dict:
    loads = server.loads()
    offset = server.log_size()
    start = threading.Event()
    pool = ThreadPoolExecutor(max_workers=len(ids))
    try:
        futures = [pool.submit(_stream_one, server.url, i, p, st, start) for i, p in enumerate(ids)]
        time.sleep(0.2)  # let every thread reach the start line
        start.set()
        results = [f.result() for f in futures]
    finally:  # on SIGTERM / Ctrl-C do not wait for the streams: stopping the server ends them
        start.set()
        pool.shutdown(wait=False, cancel_futures=True)
    time.sleep(1.0)  # the last decode log lines
    log = parse_log(server.log_since(offset))
    kv_policy = server.kv_policy()
    sends = [r.t_send for r in results if r.t_send]
    ends = [r.t_send + r.e2e_s for r in results if r.e2e_s is not None]
    wall = (max(ends) - min(sends)) if sends and ends else None
    out_tokens = sum(r.output_tokens for r in results)
    ok = [r for r in results if r.error is None]
    itl = [g for r in results for g in r.chunk_gaps_s]
    return {
        "arm": server.arm,
        "kv_policy": server.arm,
        "pool": server.pool,
        "max_total_num_tokens": loads.get("max_total_num_tokens"),
        "max_running_requests": loads.get("max_running_requests"),
        "requests": len(results),
        "completed": len(ok),
        "errors": len(results) - len(ok),
        "error_messages": [f"request {r.index}: {r.error}" for r in results if r.error],
        "output_tokens": out_tokens,
        "wall_s": wall,
        "output_tok_s": (out_tokens / wall) if wall else None,
        "running_peak": log["running_peak"],
        "running_mean": log["running_mean"],
        "queue_peak": log["queue_peak"],
        "kv_tokens_peak": log["kv_tokens_peak"],
        "decode_log_lines": log["decode_log_lines"],
        "retractions_meta": sum(r.retractions for r in results),
        "retract_log_lines": log["retract_log_lines"],
        "retracted_reqs_log": log["retracted_reqs_log"],
        "retractions": sum(r.retractions for r in results) + log["retract_log_lines"],
        "ttft_s": _summary([r.ttft_s for r in results if r.ttft_s is not None]),
        "tpot_s": _summary([r.tpot_s for r in results if r.tpot_s is not None]),
        "itl_s": _summary(itl),
        "kv_policy_state": kv_policy,  # GET /kv_policy after the batch
        # Eviction rounds' share of the batch's wall time: the round cost at this batch, measured
        # in the same run as the decode steps it interrupts.
        "round_seconds_total": _round_seconds(kv_policy),
        "round_share_of_wall": (_round_seconds(kv_policy) / wall) if wall and _round_seconds(kv_policy) else None,
        "per_request": [{k: v for k, v in asdict(r).items() if k not in ("chunk_gaps_s", "t_send")}
                        | {"tpot_s": r.tpot_s, "chunks": len(r.chunk_gaps_s) + (r.ttft_s is not None)}
                        for r in results],
        "server_cmd": shlex.join(server.cmd),
        "server_log": str(server.log_path),
        "server_pid": server.pgid,
    }


# ---- report -------------------------------------------------------------------------------

def _ratio(a, b) -> float | None:
    return (a / b) if a is not None and b else None


def ratios(results: list[dict]) -> list[dict]:
    by = {(r["pool"], r["arm"]): r for r in results}
    out = []
    for pool in dict.fromkeys(r["pool"] for r in results):
        none, vase = by.get((pool, "none")), by.get((pool, "vase"))
        if none and vase:
            out.append({"pool": pool,
                        "throughput_vase_over_none": _ratio(vase["output_tok_s"], none["output_tok_s"]),
                        "peak_running_vase_over_none": _ratio(vase["running_peak"], none["running_peak"])})
    return out


def _f(x, fmt: str, scale: float = 1.0) -> str:
    return "-" if x is None else format(x * scale, fmt)


def format_table(results: list[dict], st: Settings) -> str:
    rat = {r["pool"]: r for r in ratios(results)}
    per_request = st.prompt_len + st.output_len
    head = ["pool", "fits", "arm", "done/err", "out tok/s", "x none", "peak run", "x none", "mean run",
            "retract", "peak KV", "TTFT p50/p99 s", "TPOT p50/p99 ms", "ITL p50/p99 ms"]
    rows = []
    for r in results:
        x = rat.get(r["pool"], {}) if r["arm"] == "vase" else None
        tput_x = "" if x is None else _f(x.get("throughput_vase_over_none"), ".2f") + "x"
        peak_x = "" if x is None else _f(x.get("peak_running_vase_over_none"), ".2f") + "x"
        rows.append([
            str(r["pool"]), f"{(r['pool'] - POOL_SLACK) / per_request:.1f}" if r["pool"] >= per_request else "<1",
            r["arm"], f"{r['completed']}/{r['errors']}", _f(r["output_tok_s"], ".1f"),
            tput_x, str(r["running_peak"]), peak_x,
            _f(r["running_mean"], ".2f"), f"{r['retractions_meta']}/{r['retract_log_lines']}",
            str(r["kv_tokens_peak"]),
            f"{_f(r['ttft_s']['p50'], '.3f')}/{_f(r['ttft_s']['p99'], '.3f')}",
            f"{_f(r['tpot_s']['p50'], '.2f', 1e3)}/{_f(r['tpot_s']['p99'], '.2f', 1e3)}",
            f"{_f(r['itl_s']['p50'], '.2f', 1e3)}/{_f(r['itl_s']['p99'], '.2f', 1e3)}",
        ])
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(head, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows]
    lines.append(f"fits: full-cache requests of {st.prompt_len} + {st.output_len} tokens per pool; "
                 "x none: vase / none at the same pool; retract: meta_info.num_retractions / 'Retract requests' "
                 "log lines; peak KV: peak #token of the decode log; run: running requests per decode step")
    return "\n".join(lines)


def write_plot(results: list[dict], path: Path) -> str | None:
    """Writes the PNG; returns why it was skipped, or None."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot written (pip install matplotlib to get serving_bench.png)"
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for arm, marker in zip(ARMS, ("o", "s")):
        rs = sorted((r for r in results if r["arm"] == arm), key=lambda r: r["pool"])
        if not rs:
            continue
        pools = [r["pool"] for r in rs]
        axes[0].plot(pools, [r["output_tok_s"] or 0 for r in rs], marker=marker, label=f"--kv-policy {arm}")
        axes[1].plot(pools, [r["running_peak"] for r in rs], marker=marker, label=f"--kv-policy {arm}")
    axes[0].set_ylabel("output tokens / s")
    axes[1].set_ylabel("peak running requests")
    for ax in axes:
        ax.set_xlabel("KV pool (--max-total-tokens)")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend()
    axes[0].set_title("throughput")
    axes[1].set_title("concurrency")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


# ---- main ---------------------------------------------------------------------------------

def _round_seconds(kv_policy: dict | None) -> float | None:
    ranks = ((kv_policy or {}).get("totals") or {}).get("per_rank") or []
    secs = [x["round_seconds_total"] for x in ranks if x.get("round_seconds_total") is not None]
    # Ranks evict in parallel, so the slowest rank is the time the batch waited.
    return max(secs) if secs else None


def _rounds_note(r: dict) -> str:
    ranks = ((r.get("kv_policy_state") or {}).get("totals") or {}).get("per_rank") or []
    rounds = sum(x.get("eviction_rounds") or 0 for x in ranks)
    if not rounds:
        return ""
    p50 = [x["round_latency_ms_p50"] for x in ranks if x.get("round_latency_ms_p50") is not None]
    mx = [x["round_latency_ms_max"] for x in ranks if x.get("round_latency_ms_max") is not None]
    share = r.get("round_share_of_wall")
    return (f"; {rounds} eviction rounds, round latency p50 {_f(max(p50, default=None), '.1f')} ms, "
            f"max {_f(max(mx, default=None), '.1f')} ms, "
            f"{_f(100 * share if share is not None else None, '.1f')} % of the wall time")


def _on_sigterm(signum, frame):  # so the finally blocks stop the servers
    print(f"{PROG}: stopped by signal {signum}; stopping the servers, no results written", file=sys.stderr,
          flush=True)
    raise SystemExit(128 + signum)


def run(st: Settings) -> int:
    out = st.out if st.out is not None else Path(tempfile.mkdtemp(prefix="vase-serving-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    out = out.resolve()
    logdir = out / "logs"
    logdir.mkdir(exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="vase-serving-bench-work-"))  # server cwd, tiny model
    command = reproduce_command(st)
    print(f"{PROG}: device {st.device}, pools {st.pools}, {st.requests} requests x {st.output_len} output tokens "
          f"(prompt {st.prompt_len}), vase B={st.kv_budget} R={st.kv_recent}; output in {out}", flush=True)
    servers: list[Server] = []
    results: list[dict] = []
    failures: list[str] = []
    t_start = time.monotonic()
    try:
        model = st.model_path
        if model is None:
            from ..tiny_model import build_tiny_qwen3

            model = str(build_tiny_qwen3(scratch / "tiny-qwen3"))
            print(f"built the tiny model in {model}", flush=True)
        ids = prompts(st)
        for pool in st.pools:
            group = [Server(st, model, arm, pool, logdir, scratch) for arm in ARMS]
            if st.paired_start:  # both up before either batch, so neither runs beside a start-up
                for s in group:
                    s.launch()
                    servers.append(s)
                deadline = time.monotonic() + st.startup_timeout
                for s in group:
                    s.wait_healthy(deadline)
            for s in group:
                if not st.paired_start:
                    s.launch()
                    servers.append(s)
                    s.wait_healthy(time.monotonic() + st.startup_timeout)
                print(f"[pool {pool}] {s.arm}: server up on {s.url}; {st.requests} requests ...", flush=True)
                r = run_batch(s, st, ids)
                results.append(r)
                print(f"[pool {pool}] {s.arm}: {r['completed']}/{r['requests']} done, "
                      f"{_f(r['output_tok_s'], '.1f')} out tok/s, peak {r['running_peak']} running, "
                      f"{r['retractions']} retractions, wall {_f(r['wall_s'], '.1f')} s{_rounds_note(r)}", flush=True)
                if r["max_total_num_tokens"] not in (None, pool):
                    failures.append(f"{s.arm} server at pool {pool} sized its pool to {r['max_total_num_tokens']}")
                failures += [f"{s.arm} pool {pool} {m}" for m in r["error_messages"]]
                if not st.paired_start:
                    s.stop()
            stop_all(group)  # paired: the idle one slept through the other's batch
    except ServerError as e:
        failures.append(str(e))
    finally:
        stop_all(servers)
        shutil.rmtree(scratch, ignore_errors=True)

    plot_path = out / "serving_bench.png"
    skipped = write_plot(results, plot_path) if results else "no results to plot"
    doc = {
        "benchmark": "vase_sglang.bench.serving",
        "command": command,
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(st).items()},
        "pool_slack": POOL_SLACK,
        "results": results,
        "ratios": ratios(results),
        "failures": failures,
        "plot": None if skipped else str(plot_path),
        "plot_skipped": skipped,
        "total_s": time.monotonic() - t_start,
    }
    json_path = out / "serving_bench.json"
    json_path.write_text(json.dumps(doc, indent=2) + "\n")
    if results:
        print()
        print(format_table(results, st))
    print()
    print(f"wrote {json_path}" + ("" if skipped else f" and {plot_path}"))
    if skipped:
        print(skipped)
    print(f"reproduce: {command}")
    if failures:
        for f in failures[:20]:
            print(f"{PROG}: error: {f}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        st = resolve(args)
    except OptionError as e:
        print(f"{PROG}: error: {e} (see --help)", file=sys.stderr)
        return 2
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return run(st)
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
