"""Train the bundled reasoning model on the chain task, on CPU.

    python -m vase_sglang.bundled.train --out vase_sglang/bundled/chain-qwen3

Deterministic from ``--seed`` (data, init and order; same thread count). Phase 1: a
curriculum grows the chain length from a few steps to ``--max-chain-steps`` over the
first ``--curriculum`` share of ``--steps``, so the model first learns the step format and
the lookups on short, cheap chains. Phase 2 (``--final-steps``): default-length chains
only, with a fresh optimizer, so the model also learns where they end. Loss is on the
assistant's tokens only. Every
``--eval-every`` steps it logs teacher-forced accuracy on held-out full-length problems;
at the end it decodes them greedily and writes the accuracy into ``training.json``.
Held-out problems use seeds >= 10**13; training problem seeds are < 2**40.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import PreTrainedTokenizerFast, Qwen3ForCausalLM

from vase_sglang.bundled.model import build_tokenizer, chat_prompt, model_config
from vase_sglang.bundled.tasks.chain import HELD_OUT_SEED, ChainProblem, ChainTask, grade


@dataclass(frozen=True)
class Batch:
    input_ids: torch.Tensor  # [B, T]
    labels: torch.Tensor  # [B, T], -100 on the prompt


def encode(tokenizer: PreTrainedTokenizerFast, problems: list[ChainProblem]) -> Batch:
    """Problems of one task shape have one length, so a batch needs no padding."""
    rows, labels = [], []
    for p in problems:
        prompt = tokenizer(chat_prompt(tokenizer, p.prompt), add_special_tokens=False)["input_ids"]
        answer = tokenizer(p.completion + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
        rows.append(prompt + answer)
        labels.append([-100] * len(prompt) + answer)
    if len({len(r) for r in rows}) != 1:
        raise ValueError("problems in one batch must have one shape")
    return Batch(torch.tensor(rows), torch.tensor(labels))


def training_task(rng: random.Random, progress: float, args: argparse.Namespace) -> ChainTask:
    grown = min(1.0, progress / args.curriculum) if args.curriculum > 0 else 1.0
    longest = max(4, round(args.min_chain_steps + grown * (args.max_chain_steps - args.min_chain_steps)))
    return ChainTask(steps=rng.randint(max(3, longest // 3), longest))


def learning_rate(step: int, args: argparse.Namespace) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    done = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * done)))


def held_out(task: ChainTask, n: int) -> list[ChainProblem]:
    return [task.generate(HELD_OUT_SEED + i) for i in range(n)]


@torch.no_grad()
def teacher_forced(model: Qwen3ForCausalLM, batch: Batch) -> dict[str, float]:
    """Next-token accuracy on the assistant tokens, and the share of rows with none wrong."""
    model.eval()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(input_ids=batch.input_ids).logits[:, :-1]
    model.train()
    target = batch.labels[:, 1:]
    mask = target != -100
    right = (logits.argmax(-1) == target) & mask
    return {"token_acc": (right.sum() / mask.sum()).item(),
            "row_exact": (right.sum(1) == mask.sum(1)).float().mean().item()}


@torch.no_grad()
def greedy_accuracy(model: Qwen3ForCausalLM, tokenizer: PreTrainedTokenizerFast, problems: list[ChainProblem],
                    batch_size: int = 32) -> float:
    """Full-cache greedy decoding (HF transformers), graded like the eval harness."""
    model.eval()
    right = 0
    for start in tqdm(range(0, len(problems), batch_size), desc="greedy eval", leave=False):
        chunk = problems[start:start + batch_size]
        ids = torch.tensor([tokenizer(chat_prompt(tokenizer, p.prompt), add_special_tokens=False)["input_ids"]
                            for p in chunk])
        out = model.generate(input_ids=ids,  # type: ignore[misc]  # transformers' self-typed generate attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=len(tokenizer(chunk[0].completion)["input_ids"]) + 8,
                             eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        texts = tokenizer.batch_decode(out[:, ids.shape[1]:], skip_special_tokens=True)
        right += sum(grade(t, p.answer) for t, p in zip(texts, chunk, strict=True))
    model.train()
    return right / len(problems)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m vase_sglang.bundled.train", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("chain-qwen3"),
                    help="output model folder (default: ./chain-qwen3)")
    ap.add_argument("--seed", type=int, default=0, help="seed for init, data and order (default: 0)")
    ap.add_argument("--steps", type=int, default=3000, help="optimizer steps (default: 3000)")
    ap.add_argument("--batch-tokens", type=int, default=8192, help="tokens per optimizer step (default: 8192)")
    ap.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (default: 2e-3)")
    ap.add_argument("--warmup", type=int, default=100, help="warm-up steps (default: 100)")
    ap.add_argument("--weight-decay", type=float, default=0.05, help="AdamW weight decay (default: 0.05)")
    ap.add_argument("--min-chain-steps", type=int, default=12, help="longest chain at the start (default: 12)")
    ap.add_argument("--max-chain-steps", type=int, default=150,
                    help="longest chain after the curriculum (default: 150)")
    ap.add_argument("--curriculum", type=float, default=0.3,
                    help="share of training over which chains grow to --max-chain-steps (default: 0.3)")
    ap.add_argument("--final-steps", type=int, default=300,
                    help="phase 2 steps on default-length chains, fresh optimizer (default: 300)")
    ap.add_argument("--final-lr", type=float, default=5e-4, help="phase 2 peak learning rate (default: 5e-4)")
    ap.add_argument("--init-from", type=Path, default=None,
                    help="start from this saved model folder (a previous run's --out) instead of a fresh init")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads (default: 2)")
    ap.add_argument("--eval-every", type=int, default=200, help="teacher-forced held-out check interval (default: 200)")
    ap.add_argument("--eval-problems", type=int, default=64,
                    help="held-out problems (default task: 125 steps, 1,004 tokens) decoded greedily at the end "
                         "(default: 64)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--intermediate", type=int, default=768)
    args = ap.parse_args(argv)
    for name in ("batch_tokens", "warmup", "threads", "eval_every", "layers", "hidden", "intermediate"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.steps < 0 or args.final_steps < 0 or args.steps + args.final_steps == 0:
        ap.error("need --steps >= 0 and --final-steps >= 0, not both 0")
    if args.steps == 0 and args.init_from is None:
        ap.error("--steps 0 needs --init-from")
    if args.init_from is not None and not (args.init_from / "training.json").is_file():
        ap.error(f"--init-from {args.init_from}: no training.json there")
    if not 0 <= args.curriculum <= 1:
        ap.error(f"--curriculum must be in [0, 1], got {args.curriculum}")
    if not 4 <= args.min_chain_steps <= args.max_chain_steps:
        ap.error("need 4 <= --min-chain-steps <= --max-chain-steps")
    try:
        ChainTask(steps=args.max_chain_steps)  # the vocabulary must hold the longest chain
    except ValueError as e:
        ap.error(f"--max-chain-steps: {e}")
    return args


def _optimizer(model: Qwen3ForCausalLM, args: argparse.Namespace, lr: float) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.98))


def _step(model: Qwen3ForCausalLM, opt: torch.optim.AdamW, batch: Batch, lr: float) -> float:
    for group in opt.param_groups:
        group["lr"] = lr
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(input_ids=batch.input_ids, labels=batch.labels).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


def _batch(tokenizer: PreTrainedTokenizerFast, task: ChainTask, rng: random.Random, batch_tokens: int) -> Batch:
    length = task.n_vars * 2 + task.chain_tokens + 16
    return encode(tokenizer, [task.generate(rng.randrange(2**40)) for _ in range(max(1, batch_tokens // length))])


def train(args: argparse.Namespace) -> dict:
    """Phase 1 (``--steps``): the curriculum over chain lengths, cosine learning rate.
    Phase 2 (``--final-steps``): a fresh optimizer on default-length chains only, so the
    model learns where the default chain ends (the prompt does not say), at ``--final-lr``
    decaying to 5 %. ``--init-from`` starts from saved weights; with ``--steps 0`` it runs
    phase 2 alone, which gives the same weights as one run of both phases."""
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    tokenizer = build_tokenizer()
    if args.init_from is not None:
        model = Qwen3ForCausalLM.from_pretrained(args.init_from, dtype=torch.float32)
    else:
        model = Qwen3ForCausalLM(model_config(tokenizer, layers=args.layers, hidden=args.hidden,
                                              intermediate=args.intermediate)).to(torch.float32)  # type: ignore[arg-type]
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f} M parameters, {n_params * 4 / 2**20:.1f} MiB in float32", flush=True)
    eval_task = ChainTask()
    check = encode(tokenizer, held_out(eval_task, 8))
    args.out.mkdir(parents=True, exist_ok=True)
    previous = _previous_run(args)
    log = (args.out / "train_log.jsonl").open("w")
    for line in previous.get("log", []):
        log.write(line)
    model.train()
    start, tokens, ema = time.time(), previous.get("tokens", 0), None
    phases = [("curriculum", args.steps), ("final", args.final_steps)]
    for phase, n_steps in phases:
        if n_steps == 0:
            continue
        opt = _optimizer(model, args, args.lr if phase == "curriculum" else args.final_lr)
        bar = tqdm(range(n_steps), desc=phase, dynamic_ncols=True, mininterval=2.0)
        for step in bar:
            if phase == "curriculum":
                rng = random.Random(args.seed * 1_000_003 + step)
                task, lr = training_task(rng, step / n_steps, args), learning_rate(step, args)
            else:
                rng = random.Random(args.seed * 1_000_003 + 10**9 + step)
                task = eval_task
                lr = args.final_lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * step / n_steps)))
            batch = _batch(tokenizer, task, rng, args.batch_tokens)
            loss = _step(model, opt, batch, lr)
            tokens += batch.input_ids.numel()
            ema = loss if ema is None else 0.95 * ema + 0.05 * loss
            record = {"phase": phase, "step": step + 1, "loss": round(loss, 5), "lr": lr, "chain_steps": task.steps,
                      "tokens": tokens, "elapsed_s": round(time.time() - start, 1)}
            if (step + 1) % args.eval_every == 0 or step + 1 == n_steps:
                record.update(teacher_forced(model, check))
                tqdm.write(f"{phase} step {step + 1}: loss {ema:.4f}  held-out token acc {record['token_acc']:.4f}  "
                           f"rows exact {record['row_exact']:.2f}  ({record['elapsed_s']:.0f} s)")
            log.write(json.dumps(record) + "\n")
            log.flush()
            bar.set_postfix(loss=f"{ema:.4f}", chain=task.steps)
    train_s = time.time() - start + previous.get("train_seconds", 0.0)
    accuracy = greedy_accuracy(model, tokenizer, held_out(eval_task, args.eval_problems))
    summary = {"seed": args.seed, "steps": args.steps + previous.get("steps", 0), "final_steps": args.final_steps,
               "train_seconds": round(train_s, 1), "tokens": tokens, "parameters": n_params,
               "final_loss_ema": None if ema is None else round(ema, 5),
               "held_out": {"task": vars(eval_task), "chain_tokens": eval_task.chain_tokens,
                            "problems": args.eval_problems, "seeds_from": HELD_OUT_SEED,
                            "greedy_accuracy": accuracy},
               "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
               "previous_run": previous.get("args")}
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(args.out, safe_serialization=True)
    tokenizer.save_pretrained(args.out)
    (args.out / "training.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"trained in {train_s / 60:.1f} min; held-out greedy accuracy {accuracy:.3f} on {args.eval_problems} "
          f"problems of {eval_task.chain_tokens} chain tokens; saved {args.out}")
    return summary


def _previous_run(args: argparse.Namespace) -> dict:
    """What --init-from's folder recorded: its log lines, steps, tokens and time, carried on."""
    if args.init_from is None:
        return {}
    record = json.loads((args.init_from / "training.json").read_text())
    # The shipped chain-qwen3 carries no log (results/chain-training holds its held-out checks).
    log_path = args.init_from / "train_log.jsonl"
    log = log_path.read_text().splitlines(keepends=True) if log_path.is_file() else []
    return {"log": log, "steps": record["steps"], "tokens": record["tokens"],
            "train_seconds": record["train_seconds"], "args": record["args"]}


def main(argv: list[str] | None = None) -> int:
    train(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
