"""``python -m vase_sglang.calibrate``: which policy and budget keep your model closest to its full cache.

    python -m vase_sglang.calibrate --model-path smollm2 --prompt-set longform --budgets 64,256 --out calib/

1. Teachers: continuations sampled from the full cache (temperature and top-p from the
   model's generation config unless given; ``--greedy`` for greedy), ``--teachers`` per
   prompt, each to its natural end (EOS) or ``--tokens``.
2. Teacher forcing of every teacher under every policy x budget (x seed for the stochastic
   ones), each request with its own noise seed as on the server: KL(full || policy), top-1
   agreement and dNLL per scored token, averaged per prompt.
3. Per budget: means with 95 % bootstrap intervals over prompts, the paired difference of
   each policy to the best, the recommendation and whether its lead is beyond the interval;
   the smallest budget whose KL is at most ``--target-kl``.
4. Telemetry: each request's evicted attention (what the server reports online) beside its
   KL, their rank correlation, and the signal -> KL mappings a server with
   ``--kv-calibration`` applies to report ``kv_estimated_kl`` (``telemetry_fit``).

Writes ``calibration.json`` (what ``--kv-calibration`` reads: the per-budget results, the
recommendation and the telemetry's mappings), ``calibration.raw.json`` beside it (the
teachers' tokens, every request's per-token means and per-round signals, the telemetry's
points and per-pair fits: what the summary is computed from, ``RAW_PATHS``),
``calibration.md``, ``calibration.png`` and ``telemetry.png`` in ``--out``. A rerun resumes
from both files; with only ``calibration.json`` it measures every budget again.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch

from vase_sglang.calibrate import analysis, telemetry_fit
from vase_sglang.calibrate.analysis import CANDIDATES, STOCHASTIC
from vase_sglang.cli import JSONLineError, OneLineParser, json_lines, positive_int
from vase_sglang.config import PolicyConfig, PolicyConfigError
from vase_sglang.fidelity.loop import (
    BatchedDecoder,
    UnsupportedModel,
    check_supported,
    check_supported_config,
    eos_ids,
    sample_teacher,
)
from vase_sglang.fidelity.outputs import raw_path, read_json, write_split
from vase_sglang.fidelity.prompts import PROMPT_SETS
from vase_sglang.fidelity.sweep import ArmSpec, teacher_forced
from vase_sglang.plugin.auto import CALIBRATION_KIND, CALIBRATION_VERSION, model_fingerprint
from vase_sglang.policies import mix_seed

log = logging.getLogger("vase_sglang.calibrate")
CHAIN_SET = "chain"  # the bundled chain-qwen3's own task (it knows no English)
_ROW_SEED_STREAM = 11  # mix_seed tag: one noise seed per (seed, request row)
# The parts of a calibration that go to calibration.raw.json, not calibration.json (which
# keeps the teachers' lengths, ``teacher.ends``).
RAW_PATHS = (("teacher", "tokens"), ("raw",), ("telemetry", "points"), ("telemetry", "fits"))


def save(cal_path: Path, cal: dict[str, Any]) -> None:
    """``calibration.json`` and, beside it, ``calibration.raw.json`` (``RAW_PATHS``)."""
    write_split(cal_path, cal, RAW_PATHS)


def _csv(text: str, kind: type = int) -> list:
    try:
        values = [kind(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"expected comma-separated {kind.__name__}s, got {text!r}") from None
    if not values:
        raise ValueError(f"expected a comma-separated list, got {text!r}")
    return values


def parse_args(argv: list[str] | None):
    p = OneLineParser(prog="python -m vase_sglang.calibrate", description=__doc__.split("\n\n")[0])
    p.add_argument("--model-path", required=True,
                   help="a local HF model folder, a name from `python -m vase_sglang.models list`, or chain-qwen3 "
                        "(the bundled model)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompts", type=Path, help='JSONL, one {"messages": [...]} or {"prompt": "..."} per line')
    src.add_argument("--prompt-set", choices=[*sorted(PROMPT_SETS), CHAIN_SET], default="longform",
                     help=f"built-in prompts ({CHAIN_SET}: held-out problems of the bundled model's task)")
    p.add_argument("--num-prompts", type=positive_int, default=8, help="prompts used (the first N)")
    p.add_argument("--budgets", default="64,128,256", help="comma-separated budgets B (multiples of --recent)")
    p.add_argument("--policies", default=",".join(CANDIDATES),
                   help=f"comma-separated, from {', '.join(CANDIDATES)} (vase-outliers: vase with outlier_factor 5)")
    p.add_argument("--tokens", type=positive_int, default=1024, help="teacher length cap (a multiple of --recent)")
    p.add_argument("--recent", type=positive_int, default=32, help="recent window R (the server's --kv-recent)")
    p.add_argument("--seeds", default="0,1", help="seeds of the stochastic policies")
    p.add_argument("--teachers", type=positive_int, default=1, help="sampled teachers per prompt")
    p.add_argument("--temperature", type=float, default=None, help="teacher temperature (default: generation config)")
    p.add_argument("--top-p", type=float, default=None, help="teacher top-p (default: generation config)")
    p.add_argument("--greedy", action="store_true", help="greedy teacher (loops on small models; biased)")
    p.add_argument("--target-kl", type=float, default=0.05, help="report the smallest budget with KL <= this")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads (default: all cores)")
    p.add_argument("--out", type=Path, required=True, help="output folder")
    args = p.parse_args(argv)
    try:
        args.budgets = sorted(set(_csv(args.budgets)))
        args.seeds = _csv(args.seeds)
        args.policies = _csv(args.policies, str)
        unknown = [x for x in args.policies if x not in CANDIDATES]
        if unknown:
            raise ValueError(f"--policies: unknown {unknown[0]!r}; choose from {', '.join(CANDIDATES)}")
        for b in args.budgets:
            PolicyConfig(policy="vase", budget=b, recent=args.recent)
    except PolicyConfigError as exc:
        p.error(f"--budgets / --recent: {exc}")
    except ValueError as exc:
        p.error(str(exc))
    if args.tokens % args.recent:
        p.error(f"--tokens {args.tokens} must be a multiple of --recent {args.recent}")
    if args.temperature is not None and args.temperature < 0:
        p.error(f"--temperature {args.temperature} must be >= 0")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        p.error(f"--top-p {args.top_p} must be in (0, 1]")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA device")
    args.parser = p
    return args


def load_prompts(args) -> tuple[list[Any], str]:
    """Prompts as chat message lists (or raw strings) and a description of their source."""
    if args.prompts is None and args.prompt_set == CHAIN_SET:
        from vase_sglang.bundled.tasks.chain import HELD_OUT_SEED, ChainTask

        texts = tuple(ChainTask().generate(HELD_OUT_SEED + i).prompt for i in range(args.num_prompts))
        return [[{"role": "user", "content": t}] for t in texts], f"built-in set {CHAIN_SET}"
    if args.prompts is None:
        texts = PROMPT_SETS[args.prompt_set][: args.num_prompts]
        return [[{"role": "user", "content": t}] for t in texts], f"built-in set {args.prompt_set}"
    out: list[Any] = []
    try:
        lines = args.prompts.read_text().splitlines()
    except OSError as exc:
        args.parser.error(f"--prompts {args.prompts}: {exc.strerror}")
    try:
        for n, item in json_lines(lines):
            if isinstance(item, dict) and isinstance(item.get("messages"), list):
                out.append(item["messages"])
            elif isinstance(item, dict) and isinstance(item.get("prompt"), str):
                out.append(item["prompt"])
            else:
                args.parser.error(f'--prompts {args.prompts} line {n}: expected {{"messages": [...]}} '
                                  'or {"prompt": "..."}')
    except JSONLineError as exc:
        args.parser.error(f"--prompts {args.prompts} line {exc.line}: not JSON ({exc.msg})")
    if not out:
        args.parser.error(f"--prompts {args.prompts}: no prompts")
    return out[: args.num_prompts], str(args.prompts)


def tokenize(tok, prompts: list[Any]) -> list[list[int]]:
    out = []
    for item in prompts:
        if isinstance(item, str) or getattr(tok, "chat_template", None) is None:
            text = item if isinstance(item, str) else "\n".join(m["content"] for m in item)
            out.append(tok(text)["input_ids"])
        else:
            ids = tok.apply_chat_template(item, add_generation_prompt=True, tokenize=True)
            out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


def load_model(args):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from vase_sglang.bundled.model import BUNDLED_NAME, bundled_model_path
    from vase_sglang.models import resolve_model

    try:
        path = bundled_model_path() if args.model_path == BUNDLED_NAME else resolve_model(args.model_path)
        config = AutoConfig.from_pretrained(path)
    except Exception as exc:  # noqa: BLE001 - any loading failure is one line for the user
        args.parser.error(f"--model-path {args.model_path}: cannot load its config ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''})")
    try:
        check_supported_config(config)  # before loading weights
    except UnsupportedModel as exc:
        args.parser.error(f"--model-path {args.model_path}: {exc}")
    lm = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, args.dtype)).eval().to(args.device)
    try:
        check_supported(lm)
    except UnsupportedModel as exc:
        args.parser.error(f"--model-path {args.model_path}: {exc}")
    tok = AutoTokenizer.from_pretrained(path)
    return path, config, tok, lm


def teacher_sampling(args, lm) -> tuple[float, float]:
    if args.greedy:
        return 0.0, 1.0
    gen = getattr(lm, "generation_config", None)
    temperature = args.temperature if args.temperature is not None else (getattr(gen, "temperature", None) or 1.0)
    top_p = args.top_p if args.top_p is not None else (getattr(gen, "top_p", None) or 1.0)
    return float(temperature), float(top_p)


def specs_for(args, budget: int) -> dict[str, list[ArmSpec]]:
    out = {}
    for name in args.policies:
        c = CANDIDATES[name]
        seeds = args.seeds if name in STOCHASTIC else args.seeds[:1]
        out[name] = [ArmSpec("calibrate", c["policy"], budget, s, outlier_factor=c.get("outlier_factor"))
                     for s in seeds]
    return out


def estimate_seconds(decoder: BatchedDecoder, args, n_rows: int) -> tuple[float, float]:
    """Seconds per teacher step (one token for every row) and per teacher-forced chunk of one arm."""
    probe = decoder.new_arm("probe", None, max_tokens=2 * args.recent)
    tokens = torch.zeros((n_rows, args.recent), dtype=torch.long, device=decoder.device)
    t0 = time.monotonic()
    decoder.feed(probe, tokens[:, :1])
    step = time.monotonic() - t0
    t0 = time.monotonic()
    decoder.feed(probe, tokens[:, 1:])
    return step, time.monotonic() - t0


def setup_of(args, prompts_ids: list[list[int]], source: str, temperature: float, top_p: float) -> dict:
    return {"prompt_source": source, "prompts": len(prompts_ids), "teachers": args.teachers,
            "teacher": "greedy" if temperature == 0 else f"sampled at T={temperature:g}, top-p {top_p:g}",
            "temperature": temperature, "top_p": top_p, "tokens": args.tokens, "recent": args.recent,
            "seeds": args.seeds, "policies": args.policies, "dtype": args.dtype,
            "prompt_lengths": [len(p) for p in prompts_ids]}


def main(argv: list[str] | None = None) -> int:
    from tqdm import tqdm

    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    if args.threads:
        torch.set_num_threads(args.threads)
    prompts, source = load_prompts(args)
    path, config, tok, lm = load_model(args)
    ids = tokenize(tok, prompts)
    temperature, top_p = teacher_sampling(args, lm)
    eos = eos_ids(tok, lm)
    signature = setup_of(args, ids, source, temperature, top_p)
    args.out.mkdir(parents=True, exist_ok=True)
    cal_path = args.out / "calibration.json"
    model = {"path": str(path), "model_type": config.model_type, "fingerprint": model_fingerprint(config.to_dict())}
    cal: dict[str, Any] = read_json(cal_path)
    if cal and (cal.get("setup", {}).get("signature") != signature or cal.get("model") != model):
        args.parser.error(f"--out {args.out} holds a calibration with other settings or another model; "
                          "use another --out folder (or delete calibration.json and calibration.raw.json)")
    cal.update({"kind": CALIBRATION_KIND, "version": CALIBRATION_VERSION, "model": model,
                "setup": {**signature, "signature": signature, "budgets": args.budgets,
                          "command": "python -m vase_sglang.calibrate "
                                     + " ".join(argv if argv is not None else sys.argv[1:])},
                "target_kl": args.target_kl})
    per_row = [p for p in ids for _ in range(args.teachers)]  # rows prompt-major
    decoder = BatchedDecoder(lm)
    decoder.prefill(per_row)
    t_step, t_chunk = estimate_seconds(decoder, args, len(per_row))
    todo = [b for b in args.budgets if str(b) not in cal.get("raw", {})]
    arms_per_budget = sum(len(v) for v in specs_for(args, args.budgets[0]).values())
    chunks = args.tokens // args.recent
    teacher_done = "teacher" in cal
    estimate = (0 if teacher_done else args.tokens * t_step) + len(todo) * chunks * (1 + arms_per_budget) * t_chunk
    print(f"calibrating {Path(path).name} on {len(ids)} prompts x {args.teachers} teacher(s), budgets "
          f"{args.budgets} ({len(todo)} to run), {arms_per_budget} policy runs per budget; estimated at most "
          f"{estimate / 60:.1f} min (less when teachers end early)", flush=True)
    # Redrawn every 0.1 s on a terminal; into a log file (no terminal) every 30 s.
    with tqdm(total=round(estimate, 1), unit="s", desc="calibrate", bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} "
              "est. s [{elapsed}<{remaining}]", mininterval=0.1 if sys.stderr.isatty() else 30) as bar:
        if not teacher_done:
            tokens, ends = sample_teacher(decoder, args.tokens, eos, temperature, top_p, seed=0,
                                          on_step=lambda: bar.update(t_step))
            cal["teacher"] = {"tokens": tokens.tolist(), "ends": ends}
            save(cal_path, cal)
        else:
            bar.update(args.tokens * t_step)
        ends = cal["teacher"]["ends"]
        cal["setup"]["teacher_mean_length"] = sum(ends) / len(ends)
        width = math.ceil(max(ends) / args.recent) * args.recent
        reference = torch.tensor(cal["teacher"]["tokens"], device=decoder.device)
        pad = reference[:, -1:].expand(-1, width - reference.shape[1]) if width > reference.shape[1] else None
        reference = torch.cat([reference, pad], dim=1) if pad is not None else reference[:, :width]
        n_rows = len(per_row)
        scale = chunks / max(1, width // args.recent)  # the estimate assumed --tokens for every teacher
        for b in todo:
            specs = specs_for(args, b)
            flat = [s for group in specs.values() for s in group]
            out = teacher_forced(decoder, reference, flat, args.recent, progress=False, ends=ends,
                                 row_seeds=lambda s: [mix_seed(s.seed, row, _ROW_SEED_STREAM) for row in range(n_rows)],
                                 on_chunk=lambda arms: bar.update(arms * t_chunk * scale), measure=True)
            cal.setdefault("raw", {})[str(b)] = {
                "full": {"per_request": out["full"]["per_request"]},
                **{name: {"seeds": [out[s.label]["per_request"] for s in group],
                          "rounds": [out[s.label]["rounds"] for s in group],
                          "signals": [out[s.label]["signals"] for s in group]} for name, group in specs.items()}}
            save(cal_path, cal)
    finish(cal, args, cal_path, ends)
    return 0


def finish(cal: dict[str, Any], args, cal_path: Path, ends: list[int]) -> None:
    n_prompts = cal["setup"]["prompts"]
    per_budget = {}
    for b, raw in cal["raw"].items():
        a = analysis.analyse_budget(raw, n_prompts)
        # Scored positions are 2..end; eviction changes those after the first round (> B + R + 1).
        scored = sum(max(0, e - 1) for e in ends)
        a["evicted_share"] = sum(max(0, e - (int(b) + args.recent + 1)) for e in ends) / scored if scored else 0.0
        per_budget[int(b)] = a
    cal["budgets"] = {str(b): a for b, a in sorted(per_budget.items())}
    cal["recommendation"] = analysis.recommendation(per_budget)
    cal["smallest_budget_within_target"] = analysis.smallest_within(per_budget, args.target_kl)
    telemetry = telemetry_fit.analyse(cal, {name: CANDIDATES[name] for name in args.policies})
    if telemetry is not None:
        cal["telemetry"] = telemetry
    else:
        cal.pop("telemetry", None)
        log.warning("no per-round signals in %s (written before the telemetry existed): no KL mapping", cal_path)
    save(cal_path, cal)
    md = analysis.markdown(cal) + ("\n" + telemetry_fit.markdown(telemetry) if telemetry is not None else "")
    (args.out / "calibration.md").write_text(md)
    analysis.plot(cal, args.out / "calibration.png")
    if telemetry is not None:
        telemetry_fit.plot(telemetry, args.out / "telemetry.png")
    print(md)
    for b, a in sorted(per_budget.items()):
        print(f"B={b}: recommended {a['recommended']} "
              f"({'lead beyond the interval' if a['lead_beyond_interval'] else 'lead within the interval'})")
    print(f"wrote {cal_path} (serve it: --kv-policy auto --kv-calibration {cal_path}, or with any evicting "
          f"--kv-policy for kv_estimated_kl), {raw_path(cal_path)}, {args.out / 'calibration.md'}, "
          f"{args.out / 'calibration.png'}"
          + (f", {args.out / 'telemetry.png'}" if telemetry is not None else ""))


if __name__ == "__main__":
    sys.exit(main())
