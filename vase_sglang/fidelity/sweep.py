"""The fidelity sweep: every policy, several budgets and seeds, teacher-forced on one reference.

Arms of one budget run in lockstep over the reference, ``recent`` tokens at a time, beside
a full-cache arm, so KL(full || policy) uses the exact full-cache distribution at every
position without storing it. Budgets run one after the other (bounded memory), each
with its own full-cache arm.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from vase_sglang.config import PolicyConfig
from vase_sglang.fidelity.loop import Arm, BatchedDecoder, generate
from vase_sglang.fidelity.metrics import FullChunk, PositionMetrics, repeat_4gram_share
from vase_sglang.policies import PILOT_POLICIES, POLICIES, Policy
from vase_sglang.registry import EVICTING, STOCHASTIC

log = logging.getLogger("vase_sglang.fidelity")

SWEEP_POLICIES = EVICTING
# Stochastic policies, run with several seeds: sampling noise (vase, random) or a sketch drawn
# anew every round (vase-dkv). CurDKV's seed only picks its one fixed sketch: one seed.
SEEDED = STOCHASTIC
PILOT_OUTLIER_FACTOR = 5.0


@dataclass(frozen=True)
class ArmSpec:
    """One policy configuration of the sweep."""

    group: str  # "sweep" or "pilot"
    policy: str  # a serving policy or a pilot policy
    budget: int
    seed: int = 0
    n_large: int | None = None  # None: the policy's default (B/4 for vase)
    outlier_factor: float | None = None  # None: the fixed reservation (see PolicyConfig)

    @property
    def label(self) -> str:
        extra = f" n_large={self.n_large}" if self.n_large is not None else ""
        extra += f" outlier_factor={self.outlier_factor:g}" if self.outlier_factor is not None else ""
        return f"{self.policy} B={self.budget}{extra} s{self.seed}"

    def build(self, recent: int) -> Policy:
        base = "vase" if self.policy in PILOT_POLICIES else self.policy
        cfg = PolicyConfig(policy=base, budget=self.budget, recent=recent, n_large=self.n_large,
                           outlier_factor=self.outlier_factor)
        cls = PILOT_POLICIES.get(self.policy) or POLICIES[self.policy]
        return cls(cfg, backend="torch")


def sweep_arms(budgets: list[int], seeds: list[int], pilot_budget: int | None, pilot_seeds: list[int]) -> list[ArmSpec]:
    arms = [ArmSpec("sweep", p, b, s) for b in budgets for p in SWEEP_POLICIES for s in (seeds if p in SEEDED else [0])]
    if pilot_budget is not None:
        b = pilot_budget
        arms.append(ArmSpec("pilot", "evict-large", b))
        # n_large = 0 is attention-only sampling; B/4 is the sweep's own vase arm.
        for n_large in (0, b // 8, b // 2):
            arms += [ArmSpec("pilot", "vase", b, s, n_large) for s in pilot_seeds]
        # Up to B/4 reserved, only for values >= 5x their head's median (the outlier measure's factor).
        arms += [ArmSpec("pilot", "vase", b, s, outlier_factor=PILOT_OUTLIER_FACTOR) for s in pilot_seeds]
    return arms


def teacher_forced(decoder: BatchedDecoder, reference: torch.Tensor, specs: list[ArmSpec], recent: int,
                   progress: bool = True, ends: list[int] | None = None,
                   row_seeds: Callable[[ArmSpec], list[int]] | None = None,
                   on_chunk: Callable[[int], None] | None = None, measure: bool = False) -> dict[str, dict]:
    """Feed ``reference [N, T]`` to a full-cache arm and to each spec's arm; metrics per arm.

    Position p (1-based) is scored from the logits after feeding tokens 1..p-1; position 1
    comes from the prefill and is the same for every arm, so it is left out (NaN). Each
    evicting arm is forked from the full-cache arm when its region first fills (before its
    first round nothing differs), so that shared stretch is computed once.

    ``ends``: per request, the last scored position (a teacher's natural end); later
    positions are fed but left out. With ``ends``, an arm whose region never fills is the
    full cache at every position and gets its metrics (0 rounds) instead of an error.
    ``row_seeds(spec)``: per-request noise seeds (default: the spec's seed for all).
    ``on_chunk(arms_fed)`` is called after each chunk (progress bars). ``measure``: each
    arm also reports ``signals``, per round ``[output tokens when it ran, [N] evicted
    attention]`` (``Arm.signals``).
    """
    n, t = reference.shape
    if t % recent:
        raise ValueError(f"reference length {t} must be a multiple of recent={recent}")
    full = decoder.new_arm("full", None, max_tokens=t, window=recent)
    full_metrics = PositionMetrics(n, t)
    pending: list[tuple[ArmSpec, Policy]] = [(s, s.build(recent)) for s in specs]
    running: list[tuple[ArmSpec, Arm, PositionMetrics]] = []
    start = time.monotonic()
    for c in range(0, t, recent):
        for spec, policy in [x for x in pending if x[1].config.region_size <= full.region_len]:
            seeds = row_seeds(spec) if row_seeds is not None else None
            arm = decoder.new_arm(spec.label, policy, seed=spec.seed, row_seeds=seeds, measure=measure)
            decoder.fork(full, arm)
            metrics = PositionMetrics(n, t)
            metrics.copy_from(full_metrics, c + 1)
            running.append((spec, arm, metrics))
            pending.remove((spec, policy))
        chunk = reference[:, c : c + recent]
        # Logits after feeding tokens c+1..c+recent score positions c+2..c+recent+1.
        targets = reference[:, c + 1 : min(c + recent + 1, t)]
        full_logits = decoder.feed(full, chunk)[:, : targets.shape[1]]
        full_chunk = FullChunk(full_logits)
        full_metrics.update(c + 1, full_chunk, full_logits, targets)
        for _, arm, metrics in running:
            logits = decoder.feed(arm, chunk)[:, : targets.shape[1]]
            metrics.update(c + 1, full_chunk, logits, targets)
        if on_chunk is not None:
            on_chunk(1 + len(running))
        if progress:
            el = time.monotonic() - start
            log.info("  %4d/%d tokens, %d arms running, %.0f s elapsed", c + recent, t, len(running), el)
    if pending and ends is None:
        raise ValueError(f"budgets too large for a {t}-token reference: {[s.label for s, _ in pending]}")
    everything = [full_metrics] + [m for _, _, m in running]
    if ends is not None:
        for metrics in everything:
            metrics.mask_after(ends)
    out = {"full": {"spec": None, "rounds": 0, **full_metrics.summary()}}
    for spec, arm, metrics in running:
        out[spec.label] = {"spec": spec.__dict__, "rounds": arm.rounds, **metrics.summary(),
                           **({"signals": [[g, s] for g, s in arm.signals]} if measure else {})}
    for spec, _ in pending:  # never filled its region: it is the full cache throughout
        out[spec.label] = {"spec": spec.__dict__, "rounds": 0, **full_metrics.summary(),
                           **({"signals": []} if measure else {})}
    return out


def free_running(decoder: BatchedDecoder, specs: list[ArmSpec], recent: int, n_tokens: int,
                 eos_ids: tuple[int, ...]) -> dict[str, dict]:
    """Each spec's own greedy output (EOS masked, like the reference): 4-gram repeat share."""
    out = {}
    for spec in specs:
        t0 = time.monotonic()
        arm = decoder.new_arm(spec.label, spec.build(recent), seed=spec.seed)
        toks = generate(decoder, arm, n_tokens, min_tokens=n_tokens, eos_ids=eos_ids)
        shares = [repeat_4gram_share(row.tolist()) for row in toks]
        out[spec.label] = {"spec": spec.__dict__, "repeat_4gram": sum(shares) / len(shares),
                           "repeat_4gram_per_prompt": shares, "tokens": toks.tolist()}
        log.info("free-running %s: 4-gram repeat share %.3f (%.0f s)", spec.label, out[spec.label]["repeat_4gram"],
                 time.monotonic() - t0)
    return out
