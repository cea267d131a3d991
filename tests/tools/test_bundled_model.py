"""The bundled reasoning model: tokenizer, committed weights, accuracy record, deterministic training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from vase_sglang.bundled.model import build_tokenizer, bundled_model_path, chat_prompt
from vase_sglang.bundled.tasks.chain import ChainTask
from vase_sglang.bundled.train import HELD_OUT_SEED, greedy_accuracy, held_out, parse_args, train

DEFAULT_TEST_BUDGET = 128  # the smoke test's tight budget; scripts/serve.sh serves larger ones


def test_tokenizer_covers_the_task_one_word_per_token() -> None:
    tok = build_tokenizer()
    p = ChainTask(steps=150, n_vars=6).generate(1)
    text = chat_prompt(tok, p.prompt) + p.completion
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.unk_token_id not in ids
    assert len(tok(p.completion)["input_ids"]) == len(p.completion.split())
    decoded = tok.decode(tok(p.completion)["input_ids"], skip_special_tokens=True)
    assert decoded == p.completion  # <think> markers survive skip_special_tokens, words keep single spaces


def test_bundled_model_is_small_qwen3_with_gqa() -> None:
    path = bundled_model_path()
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3ForCausalLM"]
    assert cfg["num_key_value_heads"] < cfg["num_attention_heads"]
    assert sum(f.stat().st_size for f in path.iterdir()) <= 20 * 2**20
    assert "chat_template" in json.loads((path / "tokenizer_config.json").read_text()) or \
        (path / "chat_template.jinja").is_file()


def test_training_record_meets_the_accuracy_bound() -> None:
    record = json.loads((bundled_model_path() / "training.json").read_text())
    held = record["held_out"]
    assert held["greedy_accuracy"] >= 0.9
    assert held["chain_tokens"] >= 4 * DEFAULT_TEST_BUDGET and held["seeds_from"] == HELD_OUT_SEED
    assert record["train_seconds"] <= 90 * 60 and record["steps"] == 3000 and record["final_steps"] == 300


def test_bundled_model_solves_held_out_problems_with_full_cache() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = bundled_model_path()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(path)
    # held-out problems past the ones training.json scored, so this is a fresh check
    problems = [ChainTask().generate(HELD_OUT_SEED + 10_000 + i) for i in range(8)]
    assert greedy_accuracy(model, tok, problems, batch_size=8) >= 7 / 8


TINY = ["--layers", "1", "--hidden", "64", "--intermediate", "128", "--batch-tokens", "512", "--min-chain-steps", "4",
        "--max-chain-steps", "8", "--warmup", "1", "--eval-every", "3", "--eval-problems", "1"]


def _tiny_run(out: Path, *extra: str) -> Path:
    train(parse_args(["--out", str(out), *TINY, *extra]))
    return out


def _losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "train_log.jsonl").read_text().splitlines()]


def test_training_is_deterministic_from_the_seed(tmp_path: Path) -> None:
    a, b = (_tiny_run(tmp_path / d, "--steps", "3", "--final-steps", "2") for d in ("a", "b"))
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert _losses(a) == _losses(b) and len(_losses(a)) == 5
    assert json.loads((a / "training.json").read_text())["held_out"]["problems"] == 1
    # phase 1, saved, then phase 2 from the saved folder == both phases in one run
    first = _tiny_run(tmp_path / "p1", "--steps", "3", "--final-steps", "0")
    second = _tiny_run(tmp_path / "p2", "--init-from", str(first), "--steps", "0", "--final-steps", "2")
    assert (second / "model.safetensors").read_bytes() == (a / "model.safetensors").read_bytes()
    assert _losses(second) == _losses(a)
    assert held_out(ChainTask(steps=5), 2)[0].prompt == ChainTask(steps=5).generate(HELD_OUT_SEED).prompt


@pytest.mark.parametrize("args", [["--steps", "0"], ["--steps", "-1"], ["--curriculum", "2"], ["--max-chain-steps",
                                                                                               "200"],
                                  ["--init-from", "/no/such/run"]])
def test_training_rejects_bad_options(args: list[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(args)
