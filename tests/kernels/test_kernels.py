"""Every Triton kernel against its torch reference (TRITON_INTERPRET=1 without a GPU).

Indices and gathers must match exactly; scores within the tolerances below, which
cover float32 reassociation in the kernels' blocked reductions and dots.
"""

from __future__ import annotations

import pytest
import torch
from support.constants import DEVICE
from support.regions import random_regions

from vase_sglang.config import PolicyConfig
from vase_sglang.kernels import ops, reference

SCORE_RTOL = 1e-4
SCORE_ATOL = 1e-6
# Ops with a tl.dot: on a GPU their operands go to tensor cores (TF32 for fp32 data, the
# pool's bf16 otherwise); the interpreter computes them in fp32.
DOT_RTOL, DOT_ATOL = (SCORE_RTOL, SCORE_ATOL) if DEVICE.type == "cpu" else (3e-2, 1e-4)

# (budget, recent, n_req, n_layers, kv_heads, group, head_dim): covers candidate counts
# below and above one 64-wide block, non-power-of-two head_dim, MHA and GQA.
SHAPES = [
    (16, 4, 1, 1, 1, 1, 8),
    (64, 16, 2, 2, 2, 2, 16),
    (96, 32, 2, 1, 2, 4, 24),
    (192, 64, 1, 2, 1, 3, 32),
]
# Rows wider than 512 bytes (head_dim 160 in fp32, padded to 256): half-height window row
# tiles, and CurDKV's head_dim in two chunks of 128.
WIDE_ROWS = (96, 32, 1, 1, 1, 2, 160)


def _regions(shape: tuple, dtype: torch.dtype = torch.float32):
    budget, recent, n_req, n_layers, kv_heads, group, head_dim = shape
    cfg = PolicyConfig(budget=budget, recent=recent, sinks=min(4, budget - recent - 1))
    regions = random_regions(cfg, n_req=n_req, n_layers=n_layers, kv_heads=kv_heads, group=group,
                             head_dim=head_dim, dtype=dtype)
    return cfg, regions


def _close(a: torch.Tensor, b: torch.Tensor, rtol: float = SCORE_RTOL, atol: float = SCORE_ATOL) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype
    torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("stat", ["range", "l2", "variance", "absmax"])
def test_value_stat(shape: tuple, stat: str) -> None:
    cfg, r = _regions(shape)
    cand = r.candidates(cfg.recent)
    _close(ops.value_stat(r.v_buf, cand, stat, backend="triton"), reference.value_stat(r.v_buf, cand, stat))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(("temperature", "kernel"), [(1.0, 5), (0.7, 1), (1.3, 3)])
def test_window_attention_score(shape: tuple, temperature: float, kernel: int) -> None:
    cfg, r = _regions(shape)
    cand = r.candidates(cfg.recent)
    got = ops.window_attention_score(r.queries, r.k_buf, cand, temperature, kernel, backend="triton")
    want = reference.window_attention_score(r.queries, r.k_buf, cand, temperature, kernel)
    _close(got, want, DOT_RTOL, DOT_ATOL)
    if kernel == 1:  # without pooling, each row is a mean of softmaxes: it sums to 1
        torch.testing.assert_close(got.sum(-1), torch.ones_like(got.sum(-1)), rtol=1e-5, atol=1e-5)


def test_window_attention_score_bf16_inputs() -> None:
    cfg, r = _regions(SHAPES[1], dtype=torch.bfloat16)
    cand = r.candidates(cfg.recent)
    _close(ops.window_attention_score(r.queries, r.k_buf, cand, backend="triton"),
           reference.window_attention_score(r.queries, r.k_buf, cand), DOT_RTOL, DOT_ATOL)


@pytest.mark.parametrize("shape", [*SHAPES, WIDE_ROWS])
@pytest.mark.parametrize("rank", [20, 3])
def test_cur_score(shape: tuple, rank: int) -> None:
    cfg, r = _regions(shape)
    cand = r.candidates(cfg.recent)
    sketch = torch.randn((r.n_req, r.n_layers, r.k_buf.shape[-1], rank),
                         generator=torch.Generator().manual_seed(3)).to(DEVICE)
    got = ops.cur_score(r.k_buf, r.v_buf, cand, sketch, backend="triton")
    _close(got, reference.cur_score(r.k_buf, r.v_buf, cand, sketch), DOT_RTOL, DOT_ATOL)
    torch.testing.assert_close(got.sum(-1), torch.ones_like(got.sum(-1)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("c", [5, 64, 100, 300])
@pytest.mark.parametrize("with_noise", [False, True])
def test_select_indices_exact(c: int, with_noise: bool) -> None:
    g = torch.Generator().manual_seed(c)
    rows = (3, 4) if c <= 100 else (2, 2)  # the interpreter's sort is slow on long rows
    fill = torch.rand(*rows, c, generator=g)
    reserve = torch.rand(*rows, c, generator=g)
    # Ties, zeros and negative keys exercise the tie-break and the float ordering.
    fill[..., ::3] = 0.25
    fill[..., 1::5] = 0.0
    reserve[..., 2::4] = -1.5
    noise = torch.empty(*rows, c).exponential_(generator=g) if with_noise else None
    n_sink = min(4, c // 5)
    n_large = (c - n_sink) // 3
    n_fill = c - n_sink - n_large - 1
    args = [t.to(DEVICE) if t is not None else None for t in (fill, reserve, noise)]
    got = ops.select(args[0], n_sink, n_large, n_fill, args[1], args[2], backend="triton")
    want = reference.select(args[0], n_sink, n_large, n_fill, args[1], args[2])
    assert torch.equal(got, want)
    # Without a reserve stage as well.
    got = ops.select(args[0], n_sink, 0, n_fill, None, args[2], backend="triton")
    assert torch.equal(got, reference.select(args[0], n_sink, 0, n_fill, None, args[2]))
    # Per-row reserve counts (outlier_factor), 0 and n_large among them.
    counts = torch.randint(0, n_large + 1, rows, generator=g)
    counts.view(-1)[0], counts.view(-1)[-1] = 0, n_large
    got = ops.select(args[0], n_sink, n_large, n_fill, args[1], args[2], counts.to(DEVICE), backend="triton")
    assert torch.equal(got, reference.select(args[0], n_sink, n_large, n_fill, args[1], args[2], counts.to(DEVICE)))


def test_select_with_reserve_counts_takes_the_unused_slots_from_the_fill() -> None:
    g = torch.Generator().manual_seed(5)
    fill, reserve = torch.rand(3, 40, generator=g), torch.rand(3, 40, generator=g)
    noise = torch.empty(3, 40).exponential_(generator=g)
    n_sink, n_large, n_fill = 4, 8, 12
    full = reference.select(fill, n_sink, n_large, n_fill, reserve, noise)
    none_reserved = reference.select(fill, n_sink, 0, n_fill + n_large, None, noise)
    got = reference.select(fill, n_sink, n_large, n_fill, reserve, noise, torch.tensor([n_large, 0, 3]))
    assert torch.equal(got[0], full[0])  # every reserved slot used: the fixed reservation
    assert torch.equal(got[1], none_reserved[1])  # none used: pure sampling, in draw order
    # Three reserved (the top three by reserve key), then the fill's draw without them.
    assert torch.equal(got[2, : n_sink + 3], full[2, : n_sink + 3])
    rest = reference.select(fill[2:], n_sink, 3, n_fill + n_large - 3, reserve[2:], noise[2:])[0, n_sink + 3:]
    assert torch.equal(got[2, n_sink + 3:], rest)
    assert all(len(set(row.tolist())) == n_sink + n_large + n_fill for row in got)


def test_outlier_count_counts_values_far_above_their_head_median() -> None:
    stat = torch.ones(2, 3, 50)
    stat[0, 0, [10, 20, 30]] = 20.0  # three planted outliers
    stat[0, 1, :4] = 100.0  # large values on the sinks do not count
    stat[1, 2, 5:45] = 30.0  # a row that is mostly large has a large median: nothing stands out
    counts = reference.outlier_count(stat, n_sink=4, factor=5.0, cap=12)
    assert counts.tolist() == [[3, 0, 0], [0, 0, 0]]
    assert reference.outlier_count(stat * 0, 4, 5.0, 12).sum() == 0  # all-zero values reserve nothing
    assert reference.outlier_count(stat, 4, 5.0, 2)[0, 0] == 2  # capped at n_large


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compact_exact(shape: tuple, dtype: torch.dtype) -> None:
    cfg, r = _regions(shape, dtype=dtype)
    g = torch.Generator().manual_seed(7)
    # Arbitrary kept orders (not sorted): a permutation prefix per (request, layer, head).
    perm = torch.stack([torch.randperm(cfg.region_size, generator=g) for _ in range(r.n_req * r.n_layers * r.n_heads)])
    keep = perm[:, : cfg.budget].reshape(r.n_req, r.n_layers, r.n_heads, cfg.budget).to(DEVICE)
    k1, v1 = r.k_buf.clone(), r.v_buf.clone()
    k2, v2 = r.k_buf.clone(), r.v_buf.clone()
    reference.compact(k1, v1, r.slots, keep)
    ops.compact(k2, v2, r.slots, keep, backend="triton")
    assert torch.equal(k1, k2) and torch.equal(v1, v2)
    # And the reference does what it says, checked naively for one request/layer/head.
    row, head, layer = r.slots[0], 0, 0
    for j in range(cfg.budget):
        assert torch.equal(k1[layer, row[j], head], r.k_buf[layer, row[keep[0, layer, head, j]], head])


def test_compact_leaves_other_slots_alone() -> None:
    cfg, r = _regions(SHAPES[1])
    keep = torch.arange(cfg.region_size - cfg.budget, cfg.region_size, device=DEVICE)
    keep = keep.expand(r.n_req, r.n_layers, r.n_heads, -1).contiguous()
    k, v = r.k_buf.clone(), r.v_buf.clone()
    ops.compact(k, v, r.slots, keep, backend="triton")
    untouched = torch.ones(k.shape[1], dtype=torch.bool, device=DEVICE)
    untouched[r.slots[:, : cfg.budget].flatten()] = False
    assert torch.equal(k[:, untouched], r.k_buf[:, untouched])
    assert torch.equal(v[:, untouched], r.v_buf[:, untouched])


def test_backend_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ops.resolve_backend(torch.device("cpu"), "torch") == "torch"
    assert ops.resolve_backend(torch.device("cpu"), "auto") == "torch"
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        ops.resolve_backend(torch.device("cpu"), "triton")
    with pytest.raises(ValueError, match="VASE_KERNEL_BACKEND"):
        ops.resolve_backend(torch.device("cpu"), "cuda")


@pytest.mark.parametrize("shape", [*SHAPES, WIDE_ROWS])
def test_window_attention_probs_rows_sum_to_one(shape: tuple) -> None:
    cfg, r = _regions(shape)
    cand = r.candidates(cfg.recent)
    got = ops.window_attention_probs(r.queries, r.k_buf, cand, backend="triton")
    _close(got, reference.window_attention_probs(r.queries, r.k_buf, cand), DOT_RTOL, DOT_ATOL)
    torch.testing.assert_close(got.sum(-1), torch.ones_like(got.sum(-1)), rtol=1e-5, atol=1e-5)
    # Smoothing the window attention is SnapKV's score, on both backends.
    _close(ops.smooth(got, 5, backend="triton"), reference.window_attention_score(r.queries, r.k_buf, cand),
           DOT_RTOL, DOT_ATOL)


@pytest.mark.parametrize("shape", SHAPES)
def test_evicted_mass_is_the_attention_on_the_candidates_not_kept(shape: tuple) -> None:
    cfg, r = _regions(shape)
    cand = r.candidates(cfg.recent)
    probs = ops.window_attention_probs(r.queries, r.k_buf, cand, backend="torch")
    keep = make_keep(cfg, r)
    got = ops.evicted_mass(probs, keep, backend="triton")
    want = reference.evicted_mass(probs, keep)
    _close(got, want)
    # Brute force: the mass on every candidate position that keep does not name.
    c = cand.shape[1]
    kept = torch.zeros((*probs.shape[:-1], c + 1), dtype=torch.bool, device=probs.device)
    kept.scatter_(-1, keep.clamp_max(c), True)  # every recent position (>= c) lands in the extra column
    _close(got, (probs * ~kept[..., :c]).sum(-1))
    assert bool(((got >= 0) & (got <= 1 + 1e-6)).all())


def make_keep(cfg: PolicyConfig, r) -> torch.Tensor:
    """A policy's kept positions on these regions: sinks, a random fill, the recent window."""
    from vase_sglang.policies import make_policy

    return make_policy(cfg.replace(policy="random"), backend="torch").select(r)


def test_evicted_mass_of_nothing_kept_is_the_whole_row_and_of_everything_is_zero() -> None:
    probs = torch.softmax(torch.randn(2, 3, 700, generator=torch.Generator().manual_seed(1)), -1).to(DEVICE)
    all_kept = torch.arange(700, device=DEVICE).expand(2, 3, -1)
    only_recent = torch.arange(700, 720, device=DEVICE).expand(2, 3, -1)
    for backend in ("torch", "triton"):
        assert float(ops.evicted_mass(probs, all_kept, backend=backend).abs().max()) < 1e-5
        torch.testing.assert_close(ops.evicted_mass(probs, only_recent, backend=backend),
                                   torch.ones(2, 3, device=DEVICE), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", SHAPES)
def test_carry_scores_moves_each_kept_score_and_zeroes_the_rest(shape: tuple) -> None:
    cfg, r = _regions(shape)
    c = r.n_candidates(cfg.recent)
    keep = make_keep(cfg, r)  # sinks, a fill, then the recent window (positions >= C)
    g = torch.Generator().manual_seed(3)
    carry = torch.rand((r.n_req, r.n_layers, r.n_heads, c), generator=g).to(DEVICE)
    rows = torch.arange(r.n_req, device=DEVICE) * 2 + 1  # scattered rows of a larger state
    states = {}
    for backend in ("torch", "triton"):
        state = torch.full((2 * r.n_req + 1, r.n_layers, r.n_heads, cfg.region_size + 3), 7.0, device=DEVICE)
        ops.carry_scores(state, rows, carry, keep, backend=backend)
        states[backend] = state
    assert torch.equal(states["torch"], states["triton"])
    state = states["torch"]
    # Naively: the kept position's score, 0 for a kept recent position and past B; other rows untouched.
    for i, row in enumerate(rows.tolist()):
        for layer in range(r.n_layers):
            for head in range(r.n_heads):
                got = state[row, layer, head].tolist()
                for j, pos in enumerate(keep[i, layer, head].tolist()):
                    assert got[j] == (float(carry[i, layer, head, pos]) if pos < c else 0.0)
                assert got[cfg.budget :] == [0.0] * (state.shape[-1] - cfg.budget)
    others = torch.ones(state.shape[0], dtype=torch.bool)
    others[rows.cpu()] = False
    assert bool((state[others.to(DEVICE)] == 7.0).all())
