"""``python -m vase_sglang.fidelity``: how close each policy keeps a real model to its full cache.

    python -m vase_sglang.fidelity --model smollm2 --out results/smollm2-fidelity

1. A full-cache reference continuation per prompt (greedy, EOS masked until ``--tokens``;
   with ``--sampled-teacher`` also one sampled at T=0.7).
2. Teacher forcing of that reference under every policy x budget x seed (and the paper's
   pilot ablation at ``--pilot-budget``): KL(full || policy), top-1 agreement and NLL per
   generated-token position band, and the first token where greedy output leaves the
   full cache's.
3. Free-running greedy at ``--free-budget``: each policy's own output, its 4-gram repeat share.

Writes ``results.json`` (resumable: finished parts are kept), ``results.md`` and ``fidelity.png``;
the token ids of the references and free-running outputs go to ``results.raw.json`` beside
it (``vase_sglang.fidelity.outputs``; without it, a rerun samples the references again).
The loop is the batched torch reference (``vase_sglang.fidelity.loop``) that the test
suite ties to the SGLang server's log-probs; see docs/accuracy.md, *Fidelity to the full cache*.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import torch

from vase_sglang.cli import OneLineParser, positive_int
from vase_sglang.fidelity import report
from vase_sglang.fidelity.loop import BatchedDecoder, eos_ids, generate
from vase_sglang.fidelity.metrics import repeat_4gram_share
from vase_sglang.fidelity.prompts import PROMPTS
from vase_sglang.fidelity.sweep import SWEEP_POLICIES, ArmSpec, free_running, sweep_arms, teacher_forced

log = logging.getLogger("vase_sglang.fidelity")


def int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 0:
        raise ValueError(f"expected comma-separated non-negative integers, got {text!r}")
    return values


def parse_args(argv: list[str] | None):
    p = OneLineParser(prog="python -m vase_sglang.fidelity", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2", help="a name from `python -m vase_sglang.models list`, or a path")
    p.add_argument("--out", type=Path, required=True, help="output folder (results.json, results.md, fidelity.png)")
    p.add_argument("--prompts", type=positive_int, default=32, help=f"how many prompts (at most {len(PROMPTS)})")
    p.add_argument("--tokens", type=positive_int, default=1024, help="reference length; a multiple of --recent")
    p.add_argument("--budgets", default="64,128,256", help="comma-separated budgets B (multiples of --recent)")
    p.add_argument("--recent", type=positive_int, default=32, help="recent window R = round interval")
    p.add_argument("--seeds", default="0,1,2", help="seeds of the seeded policies")
    p.add_argument("--pilot-budget", type=int, default=128, help="budget of the pilot ablation (0: skip it)")
    p.add_argument("--pilot-seeds", default="0", help="seeds of the pilot's sampled arms")
    p.add_argument("--free-budget", type=int, default=128, help="budget of the free-running runs (0: skip them)")
    p.add_argument("--free-prompts", type=positive_int, default=8,
                   help="prompts of the free-running runs (one token per step: the slow part)")
    p.add_argument("--sampled-teacher", type=float, default=0.7, metavar="T",
                   help="also teacher-force a full-cache reference sampled at temperature T (0: skip)")
    p.add_argument("--sampled-budgets", default="128", help="budgets teacher-forced on the sampled reference")
    p.add_argument("--sampled-policies", default=",".join(SWEEP_POLICIES),
                   help="policies teacher-forced on the sampled reference (first seed only)")
    p.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: all cores)")
    args = p.parse_args(argv)
    try:
        args.budgets = int_list(args.budgets)
        args.seeds = int_list(args.seeds)
        args.pilot_seeds = int_list(args.pilot_seeds)
        args.sampled_budgets = int_list(args.sampled_budgets) if args.sampled_teacher > 0 else []
        args.sampled_policies = [x.strip() for x in args.sampled_policies.split(",") if x.strip()]
        unknown = sorted(set(args.sampled_policies) - set(SWEEP_POLICIES))
        if unknown:
            raise ValueError(f"--sampled-policies: unknown {unknown[0]!r}; choose from {', '.join(SWEEP_POLICIES)}")
    except ValueError as exc:
        p.error(str(exc))
    if args.prompts > len(PROMPTS):
        p.error(f"--prompts {args.prompts}: only {len(PROMPTS)} prompts are written")
    if args.tokens % args.recent:
        p.error(f"--tokens {args.tokens} must be a multiple of --recent {args.recent}")
    for b in args.budgets + args.sampled_budgets + [x for x in (args.pilot_budget, args.free_budget) if x]:
        if b % args.recent or b < 2 * args.recent:
            p.error(f"budget {b} must be a multiple of --recent {args.recent} and at least {2 * args.recent}")
    return args


def load(model: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vase_sglang.models import resolve_model

    path = resolve_model(model)
    tok = AutoTokenizer.from_pretrained(path)
    lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return path, tok, lm


def chat_ids(tok, prompts: tuple[str, ...]) -> list[list[int]]:
    out = []
    for text in prompts:
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
        out.append(list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids))
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    if args.threads:
        torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    results_path = args.out / "results.json"
    results = report.load_results(results_path)
    path, tok, lm = load(args.model)
    prompts = PROMPTS[: args.prompts]
    prompt_ids = chat_ids(tok, prompts)
    eos = eos_ids(tok, lm)
    results["setup"] = {
        "model": str(path), "prompts": len(prompts), "tokens": args.tokens, "recent": args.recent,
        "budgets": args.budgets, "seeds": args.seeds, "pilot_budget": args.pilot_budget,
        "pilot_seeds": args.pilot_seeds, "free_budget": args.free_budget,
        "sampled_teacher": args.sampled_teacher, "sampled_budgets": args.sampled_budgets,
        "command": "python -m vase_sglang.fidelity " + " ".join(argv if argv is not None else sys.argv[1:]),
        "threads": torch.get_num_threads(), "eos_ids": list(eos),
        "prompt_lengths": [len(p) for p in prompt_ids],
    }
    decoder = BatchedDecoder(lm)
    t0 = time.monotonic()
    decoder.prefill(prompt_ids)
    log.info("prefilled %d prompts (%d-%d tokens) in %.1f s", len(prompt_ids), min(map(len, prompt_ids)),
             max(map(len, prompt_ids)), time.monotonic() - t0)

    teachers = {"greedy": (0.0, args.budgets)}
    if args.sampled_teacher > 0:
        teachers["sampled"] = (args.sampled_teacher, args.sampled_budgets)
    refs = results.setdefault("references", {})
    for name, (temp, budgets) in teachers.items():
        if "tokens" not in refs.get(name, {}):  # none yet, or results.raw.json is gone
            t0 = time.monotonic()
            stops: list[int | None] = []
            toks = generate(decoder, decoder.new_arm("full", None, max_tokens=args.tokens), args.tokens,
                            temperature=temp, min_tokens=args.tokens, eos_ids=eos, seed=0, stops=stops)
            refs[name] = {"temperature": temp, "tokens": toks.tolist(), "eos_top1_at": stops,
                          "text_head": [tok.decode(row[:60]) for row in toks.tolist()[:4]],
                          "seconds": time.monotonic() - t0}
            report.save_results(results_path, results)
            log.info("%s reference: %d x %d tokens in %.0f s", name, *toks.shape, time.monotonic() - t0)
        reference = torch.tensor(refs[name]["tokens"])
        tf = results.setdefault("teacher_forced", {}).setdefault(name, {})
        for b in budgets:
            key = f"B={b}"
            if key in tf:
                continue
            pilot = args.pilot_budget if (name == "greedy" and b == args.pilot_budget) else None
            specs = sweep_arms([b], args.seeds, pilot, args.pilot_seeds)
            if name != "greedy":
                specs = [s for s in specs if s.seed == args.seeds[0] and s.policy in args.sampled_policies]
            log.info("teacher %s, budget %d: %d arms", name, b, len(specs))
            t0 = time.monotonic()
            tf[key] = teacher_forced(decoder, reference, specs, args.recent)
            tf[key]["seconds"] = time.monotonic() - t0
            report.save_results(results_path, results)
            report.write_all(results, args.out)

    if args.free_budget and "free_running" not in results:
        specs = [ArmSpec("sweep", p, args.free_budget, args.seeds[0]) for p in SWEEP_POLICIES]
        small = BatchedDecoder(lm)
        small.prefill(prompt_ids[: args.free_prompts])
        fr = free_running(small, specs, args.recent, args.tokens, eos)
        greedy = refs["greedy"]["tokens"][: args.free_prompts]
        fr["full"] = {"spec": None, "repeat_4gram": sum(map(repeat_4gram_share, greedy)) / len(greedy)}
        results["free_running"] = fr
        report.save_results(results_path, results)

    report.write_all(results, args.out)
    log.info("wrote %s, %s, %s", results_path, args.out / "results.md", args.out / "fidelity.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
