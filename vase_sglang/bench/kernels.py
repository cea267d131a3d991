"""Kernel benchmark: each Triton kernel against its torch reference, side by side.

    python -m vase_sglang.bench.kernels                 # GPU: Qwen3-8B geometry
    python -m vase_sglang.bench.kernels --requests 1,8  # fewer batch sizes

On a GPU it times both backends in the same run and prints torch_ms / triton_ms. On a
machine without a GPU it times the torch path only, at reduced shapes, and says so; with
``TRITON_INTERPRET=1`` it also times the Triton kernels in the interpreter. Interpreter
times measure how many programs and tile operations a kernel runs (each costs Python
work), not GPU speed: use them to compare two versions of a kernel, side by side.

    TRITON_INTERPRET=1 python -m vase_sglang.bench.kernels --requests 1,4 --budgets 256
    python -m vase_sglang.bench.kernels --policies snapkv,h2o,gkv,tova   # a whole round per policy

``--policies`` adds one ``<policy>_round`` row per policy: its selection (scores, noise,
select, the telemetry off) and, for a stateful policy, moving its carried scores; not the
compaction, which is the same for every policy.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from ..config import PolicyConfig
from ..kernels import ops
from ..policies import Regions, carried_scores, make_policy


@dataclass
class Row:
    op: str
    requests: int
    budget: int
    torch_ms: float | None
    triton_ms: float | None

    @property
    def ratio(self) -> float | None:
        if self.torch_ms is None or self.triton_ms is None:
            return None
        return self.torch_ms / self.triton_ms


def _time(fn: Callable[[], object], device: torch.device, repeat: int) -> float:
    fn()  # warm-up (and Triton compilation)
    samples = []
    for _ in range(repeat):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def _regions(n_req: int, cfg: PolicyConfig, layers: int, q_heads: int, kv_heads: int, head_dim: int,
             dtype: torch.dtype, device: torch.device) -> Regions:
    length = cfg.region_size
    n_slots = n_req * length + 1
    g = torch.Generator(device=device).manual_seed(0)
    k_buf = torch.randn((layers, n_slots, kv_heads, head_dim), generator=g, device=device, dtype=dtype)
    v_buf = torch.randn((layers, n_slots, kv_heads, head_dim), generator=g, device=device, dtype=dtype)
    perm = torch.randperm(n_slots - 1, generator=g, device=device) + 1
    slots = perm.reshape(n_req, length)
    queries = torch.randn((n_req, layers, q_heads, cfg.recent, head_dim), generator=g, device=device, dtype=dtype)
    return Regions(k_buf, v_buf, slots, seeds=list(range(n_req)), rounds=[0] * n_req, queries=queries)


def _reference_fits(n_req: int, cfg: PolicyConfig, layers: int, q_heads: int, limit_bytes: float) -> bool:
    # The readable reference materialises the [.., Hq, R, C] logits in float32.
    return n_req * layers * q_heads * cfg.recent * cfg.budget * 4 * 3 < limit_bytes


def _round(cfg: PolicyConfig, regions: Regions, backend: str) -> None:
    """One round's choice with ``cfg``'s policy, and its carried scores moved (stateful)."""
    policy = make_policy(cfg, backend=backend)
    if policy.stateful:
        state = torch.zeros((regions.n_req, regions.n_layers, regions.n_heads, cfg.region_size),
                            device=regions.device)
        rows = torch.arange(regions.n_req, device=regions.device)
        regions = dataclasses.replace(regions, state=carried_scores(state, rows, regions.n_candidates(cfg.recent)))
    selection = policy.selection(regions)
    if selection.carry is not None:
        ops.carry_scores(state, rows, selection.carry, selection.keep, backend=backend)


def _cases(cfg: PolicyConfig, regions: Regions, sketch: torch.Tensor, score: torch.Tensor, noise: torch.Tensor,
           keep: torch.Tensor, policies: list[str]) -> dict[str, Callable[[str], object]]:
    """Each op on one batch of regions, as a function of the backend name."""
    cand = regions.candidates(cfg.recent)
    n_fill = cfg.keep_candidates - cfg.sinks - cfg.large
    queries = regions.queries
    assert queries is not None  # _regions always builds them
    return {
        "value_stat": lambda b: ops.value_stat(regions.v_buf, cand, "range", backend=b),
        "window_attention": lambda b: ops.window_attention_score(queries, regions.k_buf, cand, backend=b),
        "cur_score": lambda b: ops.cur_score(regions.k_buf, regions.v_buf, cand, sketch, backend=b),
        "select": lambda b: ops.select(score, cfg.sinks, cfg.large, n_fill, score, noise, backend=b),
        "compact": lambda b: ops.compact(regions.k_buf, regions.v_buf, regions.slots, keep, backend=b),
        "vase_round": lambda b: make_policy(cfg, backend=b).select(regions),
        **{f"{p}_round": functools.partial(_round, cfg.replace(policy=p), regions) for p in policies if p != "vase"},
    }


def bench(args: argparse.Namespace) -> list[Row]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    on_gpu = device.type == "cuda"
    time_triton = on_gpu or os.environ.get("TRITON_INTERPRET") == "1"
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    limit = (torch.cuda.get_device_properties(0).total_memory * 0.5) if on_gpu else 4e9
    rows: list[Row] = []
    for budget in args.budgets:
        cfg = PolicyConfig(budget=budget, recent=args.recent)
        for n_req in args.requests:
            regions = _regions(n_req, cfg, args.layers, args.q_heads, args.kv_heads, args.head_dim, dtype, device)
            score = torch.rand((n_req, args.layers, args.kv_heads, budget), device=device)
            noise = torch.empty_like(score).exponential_()
            keep = make_policy(cfg, backend="torch" if not on_gpu else "triton").select(regions)
            sketch = torch.randn((n_req, args.layers, args.head_dim, cfg.sketch_rank), device=device)
            fits = _reference_fits(n_req, cfg, args.layers, args.q_heads, limit)
            for name, fn in _cases(cfg, regions, sketch, score, noise, keep, args.policies).items():
                heavy = name == "window_attention" or name.endswith("_round")
                t_ms = _time(functools.partial(fn, "torch"), device, args.repeat) if (fits or not heavy) else None
                k_ms = _time(functools.partial(fn, "triton"), device, args.repeat) if time_triton else None
                rows.append(Row(name, n_req, budget, t_ms, k_ms))
                print(_format(rows[-1]), flush=True)
            del regions, keep  # free the buffers before the next, larger batch
            if on_gpu:
                torch.cuda.empty_cache()
    return rows


def _fmt(x: float | None, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def _format(row: Row) -> str:
    return (f"{row.op:<17} {row.requests:>4} {row.budget:>6} {_fmt(row.torch_ms, '12.3f'):>12} "
            f"{_fmt(row.triton_ms, '12.3f'):>12} {_fmt(row.ratio, '8.2f'):>8}")


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _policies(text: str) -> list[str]:
    from ..registry import EVICTING

    names = [x for x in text.split(",") if x]
    if bad := [x for x in names if x not in EVICTING]:
        raise argparse.ArgumentTypeError(f"unknown evicting policy {bad[0]!r}; choose from {', '.join(EVICTING)}")
    return names


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    gpu = torch.cuda.is_available()
    p = argparse.ArgumentParser(prog="python -m vase_sglang.bench.kernels", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=_ints, default=[1, 8, 64] if gpu else [1, 4],
                   help="comma-separated request counts (default: 1,8,64 on GPU; 1,4 on CPU)")
    p.add_argument("--budgets", type=_ints, default=[2048, 4096] if gpu else [256, 512],
                   help="comma-separated budgets B (default: 2048,4096 on GPU; 256,512 on CPU)")
    p.add_argument("--recent", type=int, default=64, help="recent window R (default 64)")
    p.add_argument("--layers", type=int, default=36 if gpu else 2, help="layers (Qwen3-8B: 36)")
    p.add_argument("--q-heads", type=int, default=32 if gpu else 8, help="query heads (Qwen3-8B: 32)")
    p.add_argument("--kv-heads", type=int, default=8 if gpu else 2, help="KV heads (Qwen3-8B: 8)")
    p.add_argument("--head-dim", type=int, default=128 if gpu else 64, help="head dim (Qwen3-8B: 128)")
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16" if gpu else "fp32")
    p.add_argument("--repeat", type=int, default=10 if gpu else 3, help="timed repetitions (median is reported)")
    p.add_argument("--policies", type=_policies, default=[],
                   help="comma-separated evicting policies: one whole-round row each (vase's is always there)")
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if torch.cuda.is_available():
        print(f"# GPU: {torch.cuda.get_device_name(0)}; Triton vs torch reference, same run; "
              "ratio = torch_ms / triton_ms")
    elif os.environ.get("TRITON_INTERPRET") == "1":
        print("# No GPU: Triton in the interpreter vs the torch reference, reduced shapes "
              f"(layers={args.layers}, q_heads={args.q_heads}, kv_heads={args.kv_heads}, head_dim={args.head_dim}); "
              "interpreter times count programs and tile ops, not GPU speed")
    else:
        print("# No GPU: timing the torch reference path only, at reduced shapes "
              f"(layers={args.layers}, q_heads={args.q_heads}, kv_heads={args.kv_heads}, head_dim={args.head_dim}). "
              "Triton columns need a GPU.")
    print(f"{'op':<17} {'reqs':>4} {'budget':>6} {'torch_ms':>12} {'triton_ms':>12} {'ratio':>8}")
    rows = bench(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) | {"ratio": r.ratio} for r in rows], f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
