"""Property tests over random shapes and budgets, for every evicting policy."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.regions import random_regions

from vase_sglang import registry
from vase_sglang.config import PolicyConfig
from vase_sglang.kernels import ops, reference
from vase_sglang.policies import POLICIES, make_policy

EVICTING = [name for name, cls in POLICIES.items() if cls.evicts]
STOCHASTIC = list(registry.STOCHASTIC)


@st.composite
def configs(draw: st.DrawFn, policy: str | None = None, fixed_reservation: bool = False) -> PolicyConfig:
    recent = draw(st.sampled_from([2, 4, 8]))
    sinks = draw(st.integers(0, 4))
    budget = recent * draw(st.integers(max(2, math.ceil((sinks + recent + 1) / recent)), 8))
    n_large = draw(st.integers(0, budget - recent - sinks))
    return PolicyConfig(
        policy=policy or draw(st.sampled_from(EVICTING)),
        budget=budget, recent=recent, sinks=sinks, n_large=n_large,
        value_stat=draw(st.sampled_from(["range", "l2", "variance", "absmax"])),
        smoothing_kernel=draw(st.sampled_from([1, 3, 5])),
        sketch_rank=draw(st.integers(1, 6)),
        outlier_factor=None if fixed_reservation else draw(st.sampled_from([None, 1.5, 5.0])),
    )


shapes = st.fixed_dictionaries({
    "n_req": st.integers(1, 2),
    "n_layers": st.integers(1, 2),
    "kv_heads": st.integers(1, 2),
    "group": st.integers(1, 3),
    "head_dim": st.sampled_from([4, 8, 12]),
    "seed": st.integers(0, 10_000),
})

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(cfg=configs(), shape=shapes)
def test_kept_sets_have_budget_slots_sinks_and_recent(cfg: PolicyConfig, shape: dict) -> None:
    regions = random_regions(cfg, **shape)
    keep = make_policy(cfg, backend="torch").select(regions)
    assert keep.shape == (shape["n_req"], shape["n_layers"], shape["kv_heads"], cfg.budget)
    assert keep.dtype == torch.int64
    flat = keep.reshape(-1, cfg.budget)
    assert ((flat >= 0) & (flat < cfg.region_size)).all()
    assert all(row.unique().numel() == cfg.budget for row in flat)  # no duplicates
    # Stated order: sinks first, the recent window last and in slot order.
    assert torch.equal(flat[:, : cfg.sinks], torch.arange(cfg.sinks).expand(flat.shape[0], -1))
    recent = torch.arange(cfg.budget, cfg.region_size).expand(flat.shape[0], -1)
    assert torch.equal(flat[:, cfg.budget - cfg.recent :], recent)


@FAST
@given(cfg=configs(policy="vase", fixed_reservation=True), shape=shapes)
def test_vase_keeps_top_n_large_by_value_statistic(cfg: PolicyConfig, shape: dict) -> None:
    regions = random_regions(cfg, **shape)
    keep = make_policy(cfg, backend="torch").select(regions)
    stat = reference.value_stat(regions.v_buf, regions.candidates(cfg.recent), cfg.value_stat)
    stat[..., : cfg.sinks] = float("-inf")
    top = stat.topk(cfg.large, dim=-1).indices.sort(-1).values
    reserved = keep[..., cfg.sinks : cfg.sinks + cfg.large]
    # The reserved block holds the top-n_large (up to ties), in descending statistic order.
    got_vals = torch.gather(stat, -1, reserved)
    want_vals = torch.gather(stat, -1, top).sort(-1, descending=True).values
    assert torch.equal(got_vals, want_vals)
    assert (got_vals[..., :-1] >= got_vals[..., 1:]).all()


@FAST
@given(cfg=configs(policy="vase"), shape=shapes)
def test_vase_with_outlier_factor_reserves_exactly_the_outliers(cfg: PolicyConfig, shape: dict) -> None:
    cfg = cfg.replace(outlier_factor=cfg.outlier_factor or 3.0)
    regions = random_regions(cfg, **shape)
    keep = make_policy(cfg, backend="torch").select(regions)
    stat = reference.value_stat(regions.v_buf, regions.candidates(cfg.recent), cfg.value_stat)
    body = stat[..., cfg.sinks:]
    outlier = (body >= cfg.outlier_factor * body.median(-1, keepdim=True).values) & (body > 0)
    counts = outlier.sum(-1).clamp_max(cfg.large)
    flat_keep, flat_stat = keep.reshape(-1, cfg.budget), stat.reshape(-1, stat.shape[-1])
    for row, st_row, n, is_out in zip(flat_keep, flat_stat, counts.reshape(-1), outlier.reshape(-1, body.shape[-1]),
                                      strict=True):
        reserved = row[cfg.sinks : cfg.sinks + int(n)]
        # The reserved block holds n outliers by descending statistic (all of them when they fit) ...
        assert is_out[reserved - cfg.sinks].all()
        assert (st_row[reserved][:-1] >= st_row[reserved][1:]).all()
        if int(is_out.sum()) <= cfg.large:
            assert set((is_out.nonzero().squeeze(-1) + cfg.sinks).tolist()) == set(reserved.tolist())


def test_planted_outliers_are_all_kept_and_a_region_without_reserves_nothing() -> None:
    """Values with 20x the usual range are reserved (kept whatever their attention); a region
    without such values reserves none, so VaSE becomes pure attention sampling there."""
    cfg = PolicyConfig(policy="vase", budget=64, recent=16, outlier_factor=5.0)
    regions = random_regions(cfg, n_req=2, n_layers=2, kv_heads=2, head_dim=16, seed=3)
    regions.v_buf.clamp_(-1.5, 1.5)  # no outliers anywhere (the helper plants 4x ones)
    plain = make_policy(cfg, backend="torch").select(regions)
    no_reservation = make_policy(cfg.replace(n_large=0, outlier_factor=None), backend="torch").select(regions)
    assert torch.equal(plain, no_reservation)
    # Plant outliers in request 0, layer 1, head 0: positions 9, 17, 33 of its candidates.
    planted = [9, 17, 33]
    slots = regions.slots[0, planted]
    regions.v_buf[1, slots, 0] *= 20.0
    keep = make_policy(cfg, backend="torch").select(regions)
    assert keep[0, 1, 0, cfg.sinks : cfg.sinks + 3].sort().values.tolist() == planted
    assert torch.equal(keep[1], no_reservation[1]) and torch.equal(keep[0, 0], no_reservation[0, 0])
    # The fixed reservation of the paper also keeps them, but spends B/4 = 16 slots on it.
    fixed = make_policy(cfg.replace(outlier_factor=None), backend="torch").select(regions)
    assert set(planted) <= set(fixed[0, 1, 0].tolist())


@settings(max_examples=25, deadline=None)
@given(cfg=configs(), shape=shapes)
def test_same_seed_same_sets(cfg: PolicyConfig, shape: dict) -> None:
    a = make_policy(cfg, backend="torch").select(random_regions(cfg, **shape, seeds=[7] * shape["n_req"]))
    b = make_policy(cfg, backend="torch").select(random_regions(cfg, **shape, seeds=[7] * shape["n_req"]))
    assert torch.equal(a, b)


@pytest.mark.parametrize("policy", STOCHASTIC)
def test_different_seeds_give_different_sets(policy: str) -> None:
    cfg = PolicyConfig(policy=policy, budget=128, recent=32)
    kept = [
        make_policy(cfg, backend="torch").select(random_regions(cfg, seeds=[s, s])).sort(-1).values
        for s in (1, 2)
    ]
    assert not torch.equal(kept[0], kept[1])


def test_curdkv_sketch_is_fixed_across_rounds_and_vase_dkv_resamples() -> None:
    cfg = PolicyConfig(policy="curdkv", budget=128, recent=32)
    regions = random_regions(cfg)
    fixed = make_policy(cfg, backend="torch")
    resampled = make_policy(cfg.replace(policy="vase-dkv"), backend="torch")
    sketches = {}
    for rnd in (0, 1):
        regions.rounds = [rnd] * regions.n_req
        sketches[rnd] = (fixed.sketch(regions), resampled.sketch(regions))
    assert torch.equal(sketches[0][0], sketches[1][0])
    assert not torch.equal(sketches[0][1], sketches[1][1])


@settings(max_examples=20, deadline=None)
@given(cfg=configs(), shape=shapes, data=st.data())
def test_attention_after_compaction_equals_attention_over_kept_tokens(cfg: PolicyConfig, shape: dict,
                                                                        data: st.DataObject) -> None:
    regions = random_regions(cfg, **shape)
    keep = make_policy(cfg, backend="torch").select(regions)
    d = regions.k_buf.shape[-1]
    n_req, n_layers, n_heads = keep.shape[:3]
    # Expected: gather each head's kept tokens straight from the uncompacted buffer.
    kept_slots = torch.gather(regions.slots[:, None, None, :].expand(-1, n_layers, n_heads, -1), -1, keep)
    layer = torch.arange(n_layers)[None, :, None, None]
    head = torch.arange(n_heads)[None, None, :, None]
    k_direct = regions.k_buf[layer, kept_slots, head]
    v_direct = regions.v_buf[layer, kept_slots, head]
    backend = data.draw(st.sampled_from(["torch", "triton"]))
    ops.compact(regions.k_buf, regions.v_buf, regions.slots, keep, backend=backend)
    region = regions.slots[:, : cfg.budget]
    k_comp = regions.k_buf[:, region].permute(1, 0, 3, 2, 4)
    v_comp = regions.v_buf[:, region].permute(1, 0, 3, 2, 4)
    q = torch.randn(n_req, n_layers, n_heads, 1, d, generator=torch.Generator().manual_seed(shape["seed"]))
    # Same memory layout on both sides, so SDPA takes the same path and must agree bitwise.
    out_comp = torch.nn.functional.scaled_dot_product_attention(q, k_comp.contiguous(), v_comp.contiguous())
    out_direct = torch.nn.functional.scaled_dot_product_attention(q, k_direct.contiguous(), v_direct.contiguous())
    assert torch.equal(k_comp, k_direct) and torch.equal(v_comp, v_direct)
    torch.testing.assert_close(out_comp, out_direct, rtol=0, atol=0)


@settings(max_examples=8, deadline=None)
@given(cfg=configs(), shape=shapes)
def test_triton_policies_match_torch_policies(cfg: PolicyConfig, shape: dict) -> None:
    """A whole policy on Triton = Triton scores (close to torch's) + exact selection."""
    regions = random_regions(cfg, **shape)
    on_torch = make_policy(cfg, backend="torch")
    on_triton = make_policy(cfg, backend="triton")
    kept = on_triton.select(regions)
    if cfg.policy == "streamingllm":  # index arithmetic only
        assert torch.equal(kept, on_torch.select(regions))
        return
    want, got = on_torch.score(regions), on_triton.score(regions)
    torch.testing.assert_close(got.fill, want.fill, rtol=1e-4, atol=1e-6)
    if want.reserve is not None:
        torch.testing.assert_close(got.reserve, want.reserve, rtol=1e-4, atol=1e-6)
    # Feeding the Triton scores to the torch selection gives the Triton policy's sets.
    on_torch.score = lambda _regions: got  # type: ignore[method-assign]
    assert torch.equal(kept, on_torch.select(regions))


@pytest.mark.parametrize("policy", EVICTING)
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_a_longer_region_after_a_reprefill_is_brought_back_to_budget(policy: str, backend: str) -> None:
    """After a retraction the first round sees G + R positions (G > B): it keeps B of them,
    the sinks and the R newest among them, each once."""
    cfg = PolicyConfig(policy=policy, budget=32, recent=8, sinks=2)
    longer = PolicyConfig(policy=policy, budget=32 + 5 * 8, recent=8)  # only to size the dense region
    regions = random_regions(longer, n_req=2, n_layers=2, kv_heads=2, group=2, head_dim=16)
    length = regions.slots.shape[1]
    keep = make_policy(cfg, backend=backend).select(regions)
    assert keep.shape == (2, 2, 2, cfg.budget) and int(keep.max()) < length
    for row in keep.reshape(-1, cfg.budget).tolist():
        assert len(set(row)) == cfg.budget
        assert set(range(cfg.sinks)) <= set(row)
        assert row[-cfg.recent :] == list(range(length - cfg.recent, length))
    if not POLICIES[policy].draws_noise:
        other = make_policy(cfg, backend="torch" if backend == "triton" else "triton").select(regions)
        assert torch.equal(keep, other)
