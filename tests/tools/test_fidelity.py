"""The fidelity sweep's loop and metrics (``vase_sglang.fidelity``), on the tiny Qwen3.

The sweep's numbers are only as good as its loop, so the loop is tied to the oracle the
server is tested against (``ReferenceDecoder``, which ``test_e2e_server`` and
``test_e2e_smollm2`` match to the server's log-probs): batched, chunked teacher forcing
must give the same logits as that one-token-at-a-time loop, through several rounds.
"""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from support.reference_decode import ReferenceDecoder

from vase_sglang.config import PolicyConfig
from vase_sglang.fidelity.loop import BatchedDecoder, generate
from vase_sglang.fidelity.metrics import FullChunk, PositionMetrics, repeat_4gram_share
from vase_sglang.fidelity.sweep import ArmSpec, sweep_arms, teacher_forced
from vase_sglang.policies import EvictLargeValues, Regions

B, R = 64, 16
PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12, 40, 41, 42], [60, 61, 62, 63, 64, 65, 66]]
N_TOKENS = 192  # 8 rounds at B=64, R=16


@pytest.fixture(scope="module")
def model(tiny_model):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def decoder(model) -> BatchedDecoder:
    d = BatchedDecoder(model)
    d.prefill(PROMPTS)
    return d


@pytest.fixture(scope="module")
def reference(decoder) -> torch.Tensor:
    return generate(decoder, decoder.new_arm("full", None, max_tokens=N_TOKENS), N_TOKENS)


def test_prefill_matches_transformers(model, decoder) -> None:
    for i, ids in enumerate(PROMPTS):
        with torch.no_grad():
            hf = model(torch.tensor(ids)[None]).logits[0, -1]
        torch.testing.assert_close(decoder.prompt.first_logits[i], hf, rtol=0, atol=1e-4)


@pytest.mark.parametrize("policy", ["vase", "snapkv", "vase-dkv", "streamingllm"])
def test_chunked_batch_equals_the_one_token_reference_loop(model, decoder, reference, policy: str) -> None:
    """Same logits as ReferenceDecoder (the server's oracle), per prompt, through 8 rounds."""
    cfg = PolicyConfig(policy=policy, budget=B, recent=R)
    arm = decoder.new_arm(policy, ArmSpec("sweep", policy, B, 3).build(R), seed=3)
    batched = torch.cat([decoder.feed(arm, reference[:, c : c + R]) for c in range(0, N_TOKENS, R)], dim=1)
    assert arm.rounds == (N_TOKENS - (B + R)) // R
    for i, ids in enumerate(PROMPTS):
        ref = ReferenceDecoder(model, cfg, seed=3)
        ref.prefill(ids)
        one_by_one = torch.stack([ref.step(int(t)) for t in reference[i]])
        assert ref.rounds == arm.rounds
        torch.testing.assert_close(batched[i], one_by_one, rtol=0, atol=2e-4)


def test_forked_arm_equals_an_arm_run_from_the_start(decoder, reference) -> None:
    spec = ArmSpec("sweep", "vase", B, 1)
    scratch = decoder.new_arm("scratch", spec.build(R), seed=1)
    full = decoder.new_arm("full", None, max_tokens=N_TOKENS, window=R)
    for c in range(0, B + R, R):
        decoder.feed(scratch, reference[:, c : c + R])
        decoder.feed(full, reference[:, c : c + R])
    forked = decoder.new_arm("forked", spec.build(R), seed=1)
    decoder.fork(full, forked)
    for c in range(B + R, N_TOKENS, R):
        a = decoder.feed(scratch, reference[:, c : c + R])
        b = decoder.feed(forked, reference[:, c : c + R])
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert forked.rounds == scratch.rounds > 0


def test_teacher_forced_sweep_on_its_own_greedy_reference(decoder, reference) -> None:
    specs = [ArmSpec("sweep", "vase", B, 0), ArmSpec("sweep", "streamingllm", B, 0)]
    out = teacher_forced(decoder, reference, specs, R, progress=False)
    full = out["full"]
    assert full["kl"] == 0.0 and full["agree"] == 1.0
    # The reference is the full cache's greedy output: the full arm never leaves it.
    assert full["first_divergence_median"] == N_TOKENS + 1
    for spec in specs:
        arm = out[spec.label]
        assert arm["rounds"] == (N_TOKENS - (B + R)) // R
        # Before the first round every arm is the full cache (positions 2 .. B+R+1).
        first = np.array(arm["first_divergence"])
        assert (first > B + R + 1).all()
        assert arm["kl"] > 0.0 and arm["nll"] >= full["nll"] - 0.05


def test_sweep_arms_cover_policies_seeds_and_the_pilot() -> None:
    arms = sweep_arms([64, 128], [0, 1, 2], 128, [0])
    labels = {a.label for a in arms}
    assert "vase B=64 s2" in labels and "snapkv B=128 s0" in labels and "snapkv B=128 s1" not in labels
    pilot = [a for a in arms if a.group == "pilot"]
    assert {(a.policy, a.n_large, a.outlier_factor) for a in pilot} == {
        ("evict-large", None, None), ("vase", 0, None), ("vase", 16, None), ("vase", 64, None), ("vase", None, 5.0)}
    assert "vase B=128 outlier_factor=5 s0" in labels and next(
        a for a in pilot if a.outlier_factor).build(32).config.outlier_factor == 5.0


def test_kl_agreement_and_nll_by_hand() -> None:
    full_logits = torch.log(torch.tensor([[[0.5, 0.25, 0.25]]]))
    policy_logits = torch.log(torch.tensor([[[0.25, 0.5, 0.25]]]))
    m = PositionMetrics(1, 2)
    m.update(1, FullChunk(full_logits), policy_logits, torch.tensor([[0]]))
    expected_kl = 0.5 * math.log(2) + 0.25 * math.log(0.5)
    assert m.kl[0, 1] == pytest.approx(expected_kl, abs=1e-6)
    assert m.agree[0, 1] == 0.0 and m.match[0, 1] == 0.0
    assert m.nll[0, 1] == pytest.approx(math.log(4), abs=1e-6)
    assert math.isnan(m.kl[0, 0])  # position 1 comes from the prefill: not scored


def test_first_divergence_and_repeat_share() -> None:
    m = PositionMetrics(2, 5)
    m.match[:] = [[np.nan, 1, 1, 0, 1], [np.nan, 1, 1, 1, 1]]
    assert m.first_divergence().tolist() == [4, 6]
    assert repeat_4gram_share([1, 2, 3, 4, 1, 2, 3, 4]) == pytest.approx(1 / 5)
    assert repeat_4gram_share(list(range(20))) == 0.0


def test_evict_large_values_keeps_the_smallest_ranges() -> None:
    g = torch.Generator().manual_seed(0)
    cfg = PolicyConfig(policy="vase", budget=8, recent=2, sinks=1, n_large=0)
    keys = torch.randn((1, 1, 1, 10, 4), generator=g)
    values = torch.randn((1, 1, 1, 10, 4), generator=g)
    keep = EvictLargeValues(cfg, backend="torch").select(Regions.from_dense(keys, values))[0, 0, 0]
    ranges = values[0, 0, 0].amax(-1) - values[0, 0, 0].amin(-1)
    smallest = sorted(range(1, 8), key=lambda i: ranges[i].item())[:5]  # candidates 1..7 past the sink
    assert keep[:1].tolist() == [0] and sorted(keep[1:6].tolist()) == sorted(smallest)
    assert keep[6:].tolist() == [8, 9]


@pytest.mark.parametrize(("args", "needle"), [
    (["--tokens", "1000"], "must be a multiple of --recent 32"),
    (["--budgets", "64,abc"], "comma-separated"),
    (["--budgets", "48"], "budget 48 must be a multiple"),
    (["--prompts", "99"], "only 32 prompts"),
])
def test_cli_rejects_bad_options_in_one_line(tmp_path, args: list[str], needle: str) -> None:
    out = subprocess.run([sys.executable, "-m", "vase_sglang.fidelity", "--out", str(tmp_path), *args],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 2
    assert needle in out.stderr and len(out.stderr.strip().splitlines()) == 1
