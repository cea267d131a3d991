"""How often outputs loop, per policy, and what ``kv_stop_on_loop`` saves: against a running server.

    python -m vase_sglang.bench.loops --server http://127.0.0.1:30000 --policies none,vase,snapkv \\
        --budget 64 --prompt-set longform --num-prompts 16 --max-tokens 1024 --stop-on-loop --out results/x

Every prompt goes to ``/v1/chat/completions`` once per policy (``custom_params``: ``kv_policy``,
``kv_budget``; the server must evict, with ``--kv-budget`` at least ``--budget``), with
``ignore_eos`` so each output runs to ``--max-tokens`` unless it stops on a loop. Per
request it keeps the server's telemetry (``metadata.kv``: its online loop detector, where
the loop starts, the evicted attention) and applies the text definition
(``telemetry.find_text_loop``) to the output. With ``--stop-on-loop`` each policy runs a
second time with ``kv_stop_on_loop``, and the tokens it did not generate are counted.
Writes ``loops.json`` and ``loops.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests

from ..cli import OneLineParser, positive_int
from ..telemetry import find_text_loop

PROG = "python -m vase_sglang.bench.loops"


def build_parser() -> argparse.ArgumentParser:
    from ..fidelity.prompts import PROMPT_SETS

    p = OneLineParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", required=True, metavar="URL", help="a running evicting server")
    p.add_argument("--policies", default="none,vase", help="comma-separated kv_policy values (none,vase)")
    p.add_argument("--budget", type=positive_int, default=64, help="kv_budget of the evicting policies (64)")
    p.add_argument("--prompt-set", choices=sorted(PROMPT_SETS), default="longform", help="built-in prompts")
    p.add_argument("--num-prompts", type=positive_int, default=16, help="the first N prompts (16)")
    p.add_argument("--max-tokens", type=positive_int, default=1024, help="tokens per output (1024)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0: greedy)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed and kv_seed (0)")
    p.add_argument("--stop-on-loop", action="store_true", help="also run every policy with kv_stop_on_loop")
    p.add_argument("--concurrency", type=positive_int, default=8, help="requests in flight (8)")
    p.add_argument("--out", type=Path, required=True, help="output folder")
    return p


def one(url: str, prompt: str, policy: str, args: argparse.Namespace, stop: bool) -> dict[str, Any]:
    custom: dict[str, Any] = {"kv_policy": policy}
    if policy != "none":
        custom.update(kv_budget=args.budget, kv_seed=args.seed)
    if stop:
        custom["kv_stop_on_loop"] = True
    body = {"model": "default", "messages": [{"role": "user", "content": prompt}], "max_tokens": args.max_tokens,
            "temperature": args.temperature, "seed": args.seed, "ignore_eos": True, "custom_params": custom}
    r = requests.post(url.rstrip("/") + "/v1/chat/completions", json=body, timeout=3600)
    if r.status_code != 200:
        raise RuntimeError(f"{policy}: HTTP {r.status_code}: {r.text[:300]}")
    out = r.json()
    kv = ((out.get("metadata") or {}).get("kv") or [{}])[0]
    text = out["choices"][0]["message"]["content"] or ""
    return {"policy": policy, "stop_on_loop": stop, "tokens": out["usage"]["completion_tokens"],
            "finish_reason": out["choices"][0]["finish_reason"], "served_loop": kv.get("kv_loop"),
            "loop_start": kv.get("kv_loop_start"), "text_loop": find_text_loop(text) is not None,
            "evicted_attention": kv.get("kv_evicted_attention"), "rounds": kv.get("kv_eviction_rounds")}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    looped = [r for r in rows if r["served_loop"]]
    signal = [r["evicted_attention"] for r in rows if r["evicted_attention"] is not None]
    return {"requests": len(rows), "served_loop_share": statistics.fmean(bool(r["served_loop"]) for r in rows),
            "text_loop_share": statistics.fmean(r["text_loop"] for r in rows),
            "agreement": statistics.fmean(bool(r["served_loop"]) == r["text_loop"] for r in rows),
            "loop_start_median": statistics.median(r["loop_start"] for r in looped) if looped else None,
            "mean_tokens": statistics.fmean(r["tokens"] for r in rows),
            "evicted_attention_mean": statistics.fmean(signal) if signal else None}


def markdown(doc: dict[str, Any]) -> str:
    lines = [f"{doc['prompts']} `{doc['prompt_set']}` prompts, {doc['max_tokens']} tokens each (ignore_eos), "
             f"temperature {doc['temperature']}, B = {doc['budget']}. Loop: the server's online detector "
             "(`kv_loop`) and the text definition on the output; agreement: share of requests where they agree.",
             "", "| policy | kv_stop_on_loop | loops (server) | loops (text) | agreement | loop start (median token) "
             "| mean tokens | evicted attention |", "|---|---|---|---|---|---|---|---|"]
    for s in doc["summary"]:
        def f(x: Any, fmt: str) -> str:
            return "-" if x is None else format(x, fmt)
        lines.append(f"| {s['policy']} | {'yes' if s['stop_on_loop'] else 'no'} | {100 * s['served_loop_share']:.0f} % "
                     f"| {100 * s['text_loop_share']:.0f} % | {100 * s['agreement']:.0f} % | "
                     f"{f(s['loop_start_median'], '.0f')} | {s['mean_tokens']:.0f} | "
                     f"{f(s['evicted_attention_mean'], '.3f')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from ..fidelity.prompts import PROMPT_SETS

    parser = build_parser()
    args = parser.parse_args(argv)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    prompts = PROMPT_SETS[args.prompt_set][: args.num_prompts]
    arms = [(p, stop) for p in policies for stop in ((False, True) if args.stop_on_loop else (False,))]
    summary, rows = [], []
    with ThreadPoolExecutor(args.concurrency) as pool:
        for policy, stop in arms:
            try:
                got = list(pool.map(lambda q, p=policy, s=stop: one(args.server, q, p, args, s), prompts))
            except (requests.RequestException, RuntimeError, KeyError, ValueError) as exc:
                print(f"{PROG}: error: {exc}", file=sys.stderr)
                return 1
            rows += got
            summary.append({"policy": policy, "stop_on_loop": stop, **summarize(got)})
            s = summary[-1]
            print(f"{policy}{' (stop on loop)' if stop else ''}: loops {100 * s['served_loop_share']:.0f} % "
                  f"(text {100 * s['text_loop_share']:.0f} %), {s['mean_tokens']:.0f} tokens", flush=True)
    doc = {"command": f"{PROG} " + " ".join(argv if argv is not None else sys.argv[1:]),
           "prompt_set": args.prompt_set, "prompts": len(prompts), "max_tokens": args.max_tokens,
           "temperature": args.temperature, "budget": args.budget, "summary": summary, "requests": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "loops.json").write_text(json.dumps(doc, indent=1) + "\n")
    (args.out / "loops.md").write_text(markdown(doc))
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
