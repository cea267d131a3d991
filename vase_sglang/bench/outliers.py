"""Does a model show large-value outliers? The share of value vectors whose range is >= 5x the median.

    python -m vase_sglang.bench.outliers                      # the bundled model, 16 held-out chains
    python -m vase_sglang.bench.outliers --model-path DIR --problems 32 --json out.json
    python -m vase_sglang.bench.outliers --model-path DIR --fidelity-results results/smollm2-fidelity/results.json

VaSE protects the generated tokens whose value vectors have the largest range
(max - min over head_dim). That pays off when a few value vectors are much larger than
the rest. This runs the full prompt + reference answer of held-out chain problems through
the model (HF transformers, float32), takes every value vector (``v_proj`` output, per
layer, KV head and token), and reports, per layer and overall, the share whose range is
at least ``--factor`` x the median range of its (layer, head), over all tokens and over
the generated tokens only (the ones eviction chooses among). With ``--fidelity-results``
it runs the fidelity sweep's prompts and their greedy full-cache references instead
(the text the SmolLM2 sweep measured; their token ids are in the ``results.raw.json`` the
sweep writes beside ``results.json``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch


def value_ranges(model, input_ids: torch.Tensor) -> list[torch.Tensor]:
    """Per layer: [tokens, kv_heads] value ranges for one sequence."""
    cfg = model.config
    captured: list[torch.Tensor] = []
    hooks = [layer.self_attn.v_proj.register_forward_hook(lambda _m, _i, out: captured.append(out.detach()))
             for layer in model.model.layers]
    try:
        with torch.no_grad():
            model(input_ids=input_ids[None])
    finally:
        for h in hooks:
            h.remove()
    out = []
    for v in captured:
        v = v[0].view(v.shape[1], cfg.num_key_value_heads, cfg.head_dim)
        out.append(v.amax(-1) - v.amin(-1))
    return out


def outlier_shares(ranges: list[torch.Tensor], factor: float) -> dict:
    """``ranges``: per layer [tokens, heads] (many sequences concatenated)."""
    per_layer, hits, total, max_ratio = [], 0, 0, 0.0
    for r in ranges:
        ratio = r / r.median(dim=0).values.clamp_min(1e-12)
        n = int((ratio >= factor).sum())
        per_layer.append(n / ratio.numel())
        hits, total = hits + n, total + ratio.numel()
        max_ratio = max(max_ratio, float(ratio.max()))
    return {"share": hits / total, "per_layer": per_layer, "max_ratio_to_median": max_ratio, "vectors": total}


def chain_sequences(tok, problems: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, answer ids) of held-out chain problems, answers written by the task."""
    from vase_sglang.bundled.model import chat_prompt
    from vase_sglang.bundled.tasks.chain import HELD_OUT_SEED, ChainTask

    task = ChainTask()
    out = []
    for i in range(problems):
        p = task.generate(HELD_OUT_SEED + i)
        out.append((tok(chat_prompt(tok, p.prompt), add_special_tokens=False)["input_ids"],
                    tok(p.completion, add_special_tokens=False)["input_ids"]))
    return out


def reference_tokens(results: Path) -> list[list[int]] | None:
    """The greedy references' token ids of a fidelity run (None: its results.raw.json is gone)."""
    from vase_sglang.fidelity.outputs import read_json

    return read_json(results).get("references", {}).get("greedy", {}).get("tokens")


def fidelity_sequences(tok, results: Path) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, greedy reference ids) of a ``python -m vase_sglang.fidelity`` run."""
    from vase_sglang.fidelity.__main__ import chat_ids
    from vase_sglang.fidelity.prompts import PROMPTS

    refs = reference_tokens(results)
    if refs is None:
        raise ValueError(f"{results}: no greedy reference tokens")
    prompts = chat_ids(tok, PROMPTS[: len(refs)])
    return list(zip(prompts, refs, strict=True))


def measure(model_path: Path, problems: int, factor: float, fidelity_results: Path | None = None) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    seqs = fidelity_sequences(tok, fidelity_results) if fidelity_results else chain_sequences(tok, problems)
    every, generated = None, None
    for prompt, answer in seqs:
        ranges = value_ranges(model, torch.tensor(list(prompt) + list(answer)))
        every = ranges if every is None else [torch.cat([a, b]) for a, b in zip(every, ranges, strict=True)]
        gen = [r[len(prompt):] for r in ranges]
        generated = gen if generated is None else [torch.cat([a, b]) for a, b in zip(generated, gen, strict=True)]
    if every is None or generated is None:
        raise ValueError("no sequences to measure")
    return {"model": str(model_path), "sequences": len(seqs),
            "text": f"fidelity references of {fidelity_results}" if fidelity_results else "held-out chain problems",
            "factor": factor,
            "all_tokens": outlier_shares(every, factor), "generated_tokens": outlier_shares(generated, factor)}


def main(argv: list[str] | None = None) -> int:
    from vase_sglang.bundled.model import bundled_model_path

    ap = argparse.ArgumentParser(prog="python -m vase_sglang.bench.outliers", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", type=Path, default=bundled_model_path(), help="HF model folder (default: bundled)")
    ap.add_argument("--problems", type=int, default=16, help="held-out chain problems (default: 16)")
    ap.add_argument("--factor", type=float, default=5.0, help="outlier: range >= factor x median (default: 5)")
    ap.add_argument("--fidelity-results", type=Path, default=None, metavar="JSON",
                    help="measure on the prompts and greedy references of a fidelity run's results.json "
                         "(and its results.raw.json) instead of chain problems")
    ap.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = ap.parse_args(argv)
    if not (args.model_path / "config.json").is_file():
        ap.exit(2, f"{ap.prog}: error: no model at {args.model_path} (config.json missing)\n")
    if args.problems < 1 or args.factor <= 1:
        ap.exit(2, f"{ap.prog}: error: need --problems >= 1 and --factor > 1\n")
    if args.fidelity_results is not None and not args.fidelity_results.is_file():
        ap.exit(2, f"{ap.prog}: error: --fidelity-results {args.fidelity_results}: no such file\n")
    if args.fidelity_results is not None and reference_tokens(args.fidelity_results) is None:
        ap.exit(2, f"{ap.prog}: error: --fidelity-results {args.fidelity_results}: no reference tokens (the fidelity "
                   f"run writes them to {args.fidelity_results.stem}.raw.json beside it; rerun it)\n")
    res = measure(args.model_path, args.problems, args.factor, args.fidelity_results)
    for part in ("all_tokens", "generated_tokens"):
        r = res[part]
        layers = ", ".join(f"{100 * s:.2f}" for s in r["per_layer"])
        print(f"{part:>16}: {round(r['share'] * r['vectors'])} of {r['vectors']} value vectors "
              f"({100 * r['share']:.2g} %) have range >= "
              f"{args.factor:g}x the median (per layer %: {layers}); largest ratio {r['max_ratio_to_median']:.1f}x")
    if args.json:
        args.json.write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
