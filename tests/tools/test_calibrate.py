"""``python -m vase_sglang.calibrate`` and the loop it runs on other model families.

The calibration is only as good as its loop: the full-cache loop must compute each
supported family's own forward (tiny random Llama, Mistral, Qwen2 with biases, Qwen3),
and the rest of the loop is tied to the server's oracle by ``test_fidelity``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from vase_sglang.calibrate import analysis
from vase_sglang.fidelity.loop import BatchedDecoder, UnsupportedModel, check_supported, sample_teacher
from vase_sglang.fidelity.outputs import read_json
from vase_sglang.fidelity.sweep import ArmSpec

TINY = {"vocab_size": 96, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512}


def tiny(family: str, **extra):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = AutoConfig.for_model(family, **TINY, **extra)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():  # random init leaves biases at 0: make Qwen2's q/k/v biases matter
        for p in model.parameters():
            if p.dim() == 1 and p.abs().sum() == 0:
                p.normal_(0, 0.5)
    return model


FAMILIES = {  # test name -> (model_type, config changes)
    "llama": ("llama", {}),
    "llama3-rope": ("llama", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                               "high_freq_factor": 4.0, "original_max_position_embeddings": 128}}),
    "mistral": ("mistral", {"sliding_window": None}),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {"head_dim": 16}),
}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_the_full_cache_loop_computes_the_models_own_forward(name: str) -> None:
    family, changes = FAMILIES[name]
    model = tiny(family, **changes)
    check_supported(model)
    prompts = [[3, 4, 5, 6, 7, 8, 9], [10, 11, 12, 13]]
    cont = torch.tensor([[20 + i for i in range(32)], [60 - i for i in range(32)]])
    decoder = BatchedDecoder(model)
    decoder.prefill(prompts)
    arm = decoder.new_arm("full", None, max_tokens=32)
    logits = torch.cat([decoder.feed(arm, cont[:, c : c + 8]) for c in range(0, 32, 8)], dim=1)
    for i, ids in enumerate(prompts):
        with torch.no_grad():
            hf = model(torch.tensor(ids + cont[i].tolist())[None]).logits[0]
        torch.testing.assert_close(decoder.prompt.first_logits[i], hf[len(ids) - 1], rtol=0, atol=1e-4)
        torch.testing.assert_close(logits[i], hf[len(ids):], rtol=0, atol=1e-4)


def test_a_model_the_loop_cannot_reproduce_is_refused_naming_what_is_missing() -> None:
    with pytest.raises(UnsupportedModel, match="sliding-window attention"):
        check_supported(tiny("mistral", sliding_window=16))
    with pytest.raises(UnsupportedModel, match="model_type 'gpt2' is not supported"):
        from transformers import GPT2Config, GPT2LMHeadModel

        check_supported(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50)))


def test_each_request_gets_its_own_noise_seed() -> None:
    """An arm with per-row seeds computes, row by row, what one-seed arms compute."""
    model = tiny("qwen3", head_dim=16)
    prompts = [[3, 4, 5, 6], [3, 4, 5, 6]]  # equal prompts: only the noise can differ
    cont = torch.randint(20, 90, (1, 96), generator=torch.Generator().manual_seed(1)).expand(2, -1)
    decoder = BatchedDecoder(model)
    decoder.prefill(prompts)
    policy = ArmSpec("sweep", "random", 32).build(16)

    def run(**kw) -> torch.Tensor:
        arm = decoder.new_arm("a", policy, **kw)
        return torch.cat([decoder.feed(arm, cont[:, c : c + 16]) for c in range(0, 96, 16)], dim=1)

    both = run(row_seeds=[7, 8])
    torch.testing.assert_close(both[0], run(seed=7)[0], rtol=0, atol=0)
    torch.testing.assert_close(both[1], run(seed=8)[1], rtol=0, atol=0)
    assert not torch.equal(both[0], both[1])  # one shared seed would make the equal rows equal


def test_a_sampled_teacher_stops_at_its_own_eos_and_is_padded_after() -> None:
    model = tiny("llama")
    decoder = BatchedDecoder(model)
    decoder.prefill([[3, 4, 5], [6, 7, 8, 9]])
    greedy, _ = sample_teacher(decoder, 24, eos_ids=(), temperature=0.0)
    eos = int(greedy[0, 5])  # make the 6th greedy token of row 0 its EOS
    tokens, ends = sample_teacher(decoder, 24, eos_ids=(eos,), temperature=0.0)
    assert ends[0] == 1 + int((greedy[0] == eos).nonzero()[0])
    assert (tokens[0, ends[0]:] == eos).all()
    row1 = greedy[1].tolist()
    assert ends[1] == (row1.index(eos) + 1 if eos in row1 else 24)
    a, _ = sample_teacher(decoder, 16, eos_ids=(), temperature=0.8, top_p=0.9, seed=3)
    b, _ = sample_teacher(decoder, 16, eos_ids=(), temperature=0.8, top_p=0.9, seed=3)
    assert torch.equal(a, b) and not torch.equal(a, greedy[:, :16])


def test_per_prompt_means_pool_seeds_and_teachers() -> None:
    # 2 seeds x (2 prompts x 2 teachers), prompt-major rows.
    values = [[1.0, 3.0, 10.0, np.nan], [3.0, 5.0, 30.0, 20.0]]
    np.testing.assert_allclose(analysis.per_prompt(values, 2), [3.0, 20.0])


def test_the_lead_holds_only_when_every_paired_interval_is_above_zero() -> None:
    rng = np.random.default_rng(0)
    base = rng.uniform(0.1, 0.2, size=12).tolist()

    def arm(shift: float) -> dict:
        return {"seeds": [{"kl": [b + shift for b in base], "agree": [1.0] * 12, "nll": [1.0] * 12}], "rounds": [3]}

    full = {"per_request": {"kl": [0.0] * 12, "agree": [1.0] * 12, "nll": [1.0] * 12}}
    clear = analysis.analyse_budget({"full": full, "a": arm(0.0), "b": arm(0.05)}, 12)
    assert clear["recommended"] == "a" and clear["lead_beyond_interval"]
    assert clear["policies"][1]["diff"] == pytest.approx(0.05)
    noisy = {"seeds": [{"kl": [b + rng.normal(0, 0.05) for b in base], "agree": [1.0] * 12, "nll": [1.0] * 12}],
             "rounds": [3]}
    tie = analysis.analyse_budget({"full": full, "a": arm(0.0), "n": noisy}, 12)
    assert not tie["lead_beyond_interval"]
    ci = tie["policies"][1]["diff_ci"]
    assert ci[0] <= 0 <= ci[1] or ci[1] <= 0


def test_smallest_budget_within_the_target() -> None:
    per = {64: {"policies": [{"kl": 0.2}]}, 128: {"policies": [{"kl": 0.04}]}, 256: {"policies": [{"kl": 0.01}]}}
    assert analysis.smallest_within(per, 0.05) == 128
    assert analysis.smallest_within(per, 0.001) is None


def test_the_stored_mapping_keeps_only_the_knots_that_shape_it() -> None:
    from vase_sglang.calibrate.telemetry_fit import knots_only
    from vase_sglang.telemetry.estimator import KLMapping, fit_isotonic

    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, 200)
    fit = fit_isotonic(x.tolist(), (x + rng.normal(0, 0.3, 200)).tolist(), "pair")
    kept = knots_only(fit)
    assert len(kept.x) < len(fit.x) / 2 and (kept.label, kept.points) == (fit.label, fit.points)
    probes = [*fit.x, *rng.uniform(-0.5, 1.5, 2000).tolist()]
    assert [kept(p) for p in probes] == [fit(p) for p in probes]  # the same function, exactly
    assert knots_only(KLMapping((0.5,), (0.1,), "one", 1)) == KLMapping((0.5,), (0.1,), "one", 1)


def chain_prompts(path: Path, n: int) -> Path:
    from vase_sglang.bundled.tasks.chain import ChainTask

    lines = [json.dumps({"messages": [{"role": "user", "content": ChainTask().generate(i).prompt}]})
             for i in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return path


def calibrate(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vase_sglang.calibrate", *args], capture_output=True, text=True,
                          timeout=900, cwd=cwd)


def test_calibrate_end_to_end_on_the_bundled_model(tmp_path) -> None:
    from vase_sglang.bundled.model import bundled_model_path

    # Chain problems: the model answers in about 1,000 tokens, then ends with EOS.
    prompts = chain_prompts(tmp_path / "p.jsonl", 3)
    out = tmp_path / "cal"
    args = ["--model-path", str(bundled_model_path()), "--prompts", str(prompts), "--budgets", "64,256",
            "--recent", "32", "--tokens", "1088", "--teachers", "2", "--seeds", "0,1", "--temperature", "0.8",
            "--threads", "1", "--out", str(out)]
    run = calibrate(*args, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "estimated at most" in run.stdout and "## B = 64: recommended" in run.stdout
    cal = json.loads((out / "calibration.json").read_text())
    raw = json.loads((out / "calibration.raw.json").read_text())
    # calibration.json is the summary a server reads; the per-request and per-round data are beside it
    assert "raw" not in cal and set(cal["teacher"]) == {"ends"} and not {"points", "fits"} & set(cal["telemetry"])
    assert set(raw) == {"teacher", "raw", "telemetry"} and set(raw["telemetry"]) == {"points", "fits"}
    assert set(raw["teacher"]) == {"tokens"}
    assert set(cal["recommendation"]) == {"64", "256"}
    for b in ("64", "256"):
        a = cal["budgets"][b]
        names = [r["name"] for r in a["policies"]]
        assert sorted(names) == sorted(analysis.CANDIDATES)
        assert a["recommended"] == names[0] == cal["recommendation"][b]["label"]
        kls = [r["kl"] for r in a["policies"]]
        assert kls == sorted(kls) and all(k >= 0 for k in kls)
        assert 0 < a["evicted_share"] <= 1 and all(r["kl_ci"] is not None for r in a["policies"])
        assert f"B={b}: recommended {a['recommended']}" in run.stdout
    ends, tokens = cal["teacher"]["ends"], raw["teacher"]["tokens"]
    assert len(ends) == 6 and max(ends) < 1088  # 3 prompts x 2 teachers, each to its own EOS
    eos = json.loads((bundled_model_path() / "generation_config.json").read_text())["eos_token_id"]
    assert all(row[e - 1] == eos and eos not in row[: e - 1] for row, e in zip(tokens, ends, strict=True))
    assert (out / "calibration.md").read_text().startswith("# Calibration of `chain-qwen3`")
    assert (out / "calibration.png").stat().st_size > 10_000
    _check_telemetry(read_json(out / "calibration.json"), out)
    # Resumable: a rerun finds everything done and writes the same recommendation.
    again = calibrate(*args, cwd=tmp_path)
    assert again.returncode == 0 and "(0 to run)" in again.stdout
    assert json.loads((out / "calibration.json").read_text())["recommendation"] == cal["recommendation"]
    # Other settings in the same folder: refused, not mixed.
    other = calibrate(*[a if a != "0.8" else "0.5" for a in args], cwd=tmp_path)
    assert other.returncode == 2 and "holds a calibration with other settings" in other.stderr


def _check_telemetry(cal: dict, out: Path) -> None:
    """The signal beside the KL, per request, and the mappings a server loads from the file."""
    from vase_sglang.plugin.auto import load_estimator
    from vase_sglang.telemetry import STATISTICS, KLMapping

    tel = cal["telemetry"]
    assert tel["statistic"] in STATISTICS and tel["scope"] in ("model", "per_config")
    for b in ("64", "256"):
        assert set(tel["points"][b]) == set(analysis.CANDIDATES)
        for pts in tel["points"][b].values():
            n = len(pts["kl"])
            assert n > 0 and len(pts["evicted_attention"]) == len(pts["prompt"]) == len(pts["seed"]) == n
            assert pts["evicted_attention"] == pts["statistics"][tel["statistic"]]
            assert all(0 <= x for x in pts["evicted_attention"]) and all(k >= 0 for k in pts["kl"])
    assert tel["spearman"][tel["statistic"]]["pooled"] is not None
    assert {"per_config", "model", "pair_exposure", "pair_mean", "model_mean"} <= set(tel["held_out"])
    # The file round-trips: the server's estimator predicts what the stored fits predict.
    estimator = load_estimator(str(out / "calibration.json"))
    assert estimator is not None and estimator.statistic == tel["statistic"]
    model = KLMapping.from_dict(tel["fits"]["model"])
    assert estimator.model == KLMapping(model.x, model.y, model.label, model.points)
    for fit in tel["fits"]["per_config"]:
        mapping = KLMapping.from_dict(fit["mapping"])
        changes = analysis.CANDIDATES[fit["policy"]]
        served = estimator.mapping_for(changes["policy"], changes.get("outlier_factor"), fit["budget"])
        expected = mapping if tel["scope"] == "per_config" else model
        assert [served(x) for x in (0.0, 0.05, 0.3, 2.0)] == [expected(x) for x in (0.0, 0.05, 0.3, 2.0)]
    assert "## Telemetry: does the evicted attention predict the KL?" in (out / "calibration.md").read_text()
    assert (out / "telemetry.png").stat().st_size > 10_000


@pytest.mark.parametrize(("args", "needle"), [
    (["--budgets", "40"], "multiple of recent"),
    (["--policies", "vase,bogus"], "unknown 'bogus'"),
    (["--tokens", "100"], "must be a multiple of --recent"),
    (["--top-p", "0"], "--top-p 0.0 must be in (0, 1]"),
    (["--prompts", "missing.jsonl"], "No such file"),
])
def test_bad_options_fail_in_one_line(tmp_path, args: list[str], needle: str) -> None:
    run = calibrate("--model-path", "unused", "--out", str(tmp_path / "o"), *args, cwd=tmp_path)
    assert run.returncode == 2 and needle in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr


def test_an_unsupported_model_fails_in_one_line(tmp_path) -> None:
    from transformers import GPT2Config

    GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50, bos_token_id=0, eos_token_id=0).save_pretrained(
        tmp_path / "gpt2")
    run = calibrate("--model-path", str(tmp_path / "gpt2"), "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert run.returncode == 2 and "model_type 'gpt2' is not supported" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
