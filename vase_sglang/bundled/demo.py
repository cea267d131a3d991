"""A short demo of eviction on real tensors, no server needed.

    python -m vase_sglang.bundled.demo --policy vase --budget 128 --recent 32 --tokens 1000

It streams ``--tokens`` generated tokens of random K/V/Q through one request's region
(``layers x kv_heads`` heads), runs a round whenever the region holds budget + recent
tokens, and prints what each round kept.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

import torch

from ..config import POLICY_NAMES, PolicyConfig, PolicyConfigError
from ..kernels import ops
from ..policies import Regions, make_policy


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m vase_sglang.bundled.demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policy", default="vase", choices=[n for n in POLICY_NAMES if n != "none"])
    p.add_argument("--budget", type=int, default=128)
    p.add_argument("--recent", type=int, default=32)
    p.add_argument("--tokens", type=int, default=1000, help="generated tokens to stream")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--q-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        cfg = PolicyConfig(policy=args.policy, budget=args.budget, recent=args.recent)
    except PolicyConfigError as exc:
        p.error(str(exc))
    policy = make_policy(cfg)
    g = torch.Generator().manual_seed(args.seed)
    size = cfg.region_size
    k_buf = torch.zeros((args.layers, size + 1, args.kv_heads, args.head_dim))
    v_buf = torch.zeros_like(k_buf)
    slots = torch.arange(1, size + 1)[None]  # one request; slot 0 is padding, as in SGLang
    qring = torch.zeros((1, args.layers, args.q_heads, cfg.recent, args.head_dim))
    token_ids = torch.full((args.layers, args.kv_heads, size), -1)  # logical id held by each slot
    length, rounds, evicted = 0, 0, 0
    print(f"policy={cfg.policy} budget={cfg.budget} recent={cfg.recent} n_large={cfg.large} "
          f"region={size} slots per head, {args.layers} layers x {args.kv_heads} KV heads")
    t0 = time.perf_counter()
    for t in range(args.tokens):
        k_buf[:, 1 + length] = torch.randn((args.layers, args.kv_heads, args.head_dim), generator=g)
        v = torch.randn((args.layers, args.kv_heads, args.head_dim), generator=g)
        v *= 6.0 if t % 17 == 0 else 1.0  # occasional large-range value outliers
        v_buf[:, 1 + length] = v
        qring[0, :, :, t % cfg.recent] = torch.randn((args.layers, args.q_heads, args.head_dim), generator=g)
        token_ids[:, :, length] = t
        length += 1
        if length == size:
            regions = Regions(k_buf, v_buf, slots, seeds=[args.seed], rounds=[rounds], queries=qring)
            keep = policy.select(regions)
            ops.compact(k_buf, v_buf, slots, keep)
            token_ids[..., : cfg.budget] = torch.gather(token_ids, -1, keep[0])
            token_ids[..., cfg.budget :] = -1
            rounds += 1
            evicted += cfg.recent
            length = cfg.budget
            kept = token_ids[0, 0, : cfg.budget]
            outliers = int((kept[cfg.sinks :] % 17 == 0).sum())
            print(f"round {rounds:>3} at token {t + 1:>6}: kept {cfg.budget} of {size}; layer 0 head 0 keeps "
                  f"{outliers} outlier tokens, oldest kept non-sink id {int(kept[cfg.sinks:].min())}")
    dt = time.perf_counter() - t0
    print(f"done: {args.tokens} tokens, {rounds} rounds, {evicted} tokens evicted per head, "
          f"region length {length} <= {size}; {dt:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
