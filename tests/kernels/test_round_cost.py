"""What a round costs on a GPU, checked without one.

* dots on tensor cores: no kernel hard-codes fp32 ``ieee`` dots, and bf16 pools stay
  within a stated tolerance of the fp32 reference;
* K loaded once per tile of a GQA group's stacked queries: the window-attention programs
  run per KV head and tile of up to 64 stacked rows, not per query head;
* queries read in place from the ring (no per-round copy);
* every temporary counted: the live bytes a round allocates stay within
  ``Policy.workspace_bytes``, the figure the server reserves before sizing the pool;
* budgets are runtime values, and the start-up warm-up launches every kernel variant
  that requests with any allowed budget, policy and n_large reach afterwards.
"""

from __future__ import annotations

import ast
import inspect
import random
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from support.constants import DEVICE
from support.fakes import FakePool
from support.regions import random_regions
from torch.utils._python_dispatch import TorchDispatchMode

from vase_sglang.config import PolicyConfig
from vase_sglang.kernels import (
    _common,
    compact,
    cur,
    evicted_mass,
    ops,
    reference,
    select,
    value_stat,
    window_attention,
)
from vase_sglang.plugin.engine import RoundEngine, stacked_view
from vase_sglang.plugin.planning import reachable_policies, round_workspace_bytes, warmup_configs
from vase_sglang.plugin.scheduler import VaseScheduler
from vase_sglang.plugin.settings import ServerSettings
from vase_sglang.policies import POLICIES, Regions, RoundShape, make_policy

KERNEL_MODULES = (compact, cur, evicted_mass, select, value_stat, window_attention)
# bf16 operands (tensor cores on a GPU) against the fp32 reference on the same bf16 data.
BF16_RTOL, BF16_ATOL = 3e-2, 1e-4


def _jit_functions(module: Any) -> Iterator[tuple[ast.FunctionDef, ast.Call | None]]:
    tree = ast.parse(inspect.getsource(module))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            for dec in node.decorator_list:
                target = dec.func if isinstance(dec, ast.Call) else dec
                if isinstance(target, ast.Attribute) and target.attr == "jit":
                    yield node, dec if isinstance(dec, ast.Call) else None


@pytest.mark.parametrize("module", KERNEL_MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_no_dot_is_pinned_to_fp32_ieee(module: Any) -> None:
    """No ``tl.dot`` takes a constant precision (``input_precision="ieee"`` would keep fp32
    off the tensor cores): the precision is a compile-time parameter chosen per dtype."""
    for fn, _ in _jit_functions(module):
        for node in ast.walk(fn):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "dot":
                for kw in node.keywords:
                    assert not isinstance(kw.value, ast.Constant), (
                        f"{module.__name__}.{fn.name}: tl.dot with a fixed {kw.arg}={kw.value.value!r}")


# Scalar parameters whose value changes with a request's budget, window or batch.
RUNTIME_INTS = {"C", "B", "R", "n_sink", "n_large", "n_fill", "n_out", "layer0", "group", "n_layers"}


@pytest.mark.parametrize("module", KERNEL_MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_budget_dependent_ints_do_not_specialize(module: Any) -> None:
    """Triton compiles a new variant when an int argument becomes 1 or a multiple of 16;
    a per-request budget must not do that mid-serving. Only launched kernels specialize
    (the helpers they call are inlined)."""
    tree = ast.parse(inspect.getsource(module))
    launched = {c.args[0].id for c in ast.walk(tree) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
                and c.func.id == "launch" and isinstance(c.args[0], ast.Name)}
    assert launched, f"{module.__name__} launches no kernel through launch()"
    for fn, dec in _jit_functions(module):
        if fn.name not in launched:
            continue
        params = {a.arg for a in fn.args.args if a.annotation is None}
        needed = params & RUNTIME_INTS
        if not needed:
            continue
        assert dec is not None, f"{fn.name} takes {sorted(needed)} but specializes on them"
        listed: set[str] = set()
        for kw in dec.keywords:
            if kw.arg == "do_not_specialize":
                value = kw.value
                if isinstance(value, ast.Name):  # a module-level list
                    value = ast.parse(repr(getattr(module, value.id))).body[0].value  # type: ignore[attr-defined]
                listed = {e.value for e in value.elts}  # type: ignore[attr-defined]
        assert needed <= listed, f"{fn.name}: {sorted(needed - listed)} not in do_not_specialize"


@pytest.mark.parametrize(("recent", "row_tiles"), [(16, 1), (32, 2)])
def test_window_attention_runs_one_program_per_kv_head(monkeypatch: pytest.MonkeyPatch, recent: int,
                                                        row_tiles: int) -> None:
    """The grid has programs per KV head, not per query head, so each K tile is loaded once
    per tile of up to 64 of the GQA group's stacked query rows, not once per query head."""
    grids: dict[str, tuple[int, ...]] = {}
    real = window_attention.launch

    def recording(kernel: Any, grid: tuple[int, ...], *args: Any, **kw: Any) -> None:
        grids[kernel.__name__ if hasattr(kernel, "__name__") else kernel.fn.__name__] = grid
        real(kernel, grid, *args, **kw)

    monkeypatch.setattr(window_attention, "launch", recording)
    cfg = PolicyConfig(budget=64, recent=recent)
    r = random_regions(cfg, n_req=2, n_layers=2, kv_heads=2, group=4, head_dim=16)
    got = ops.window_attention_score(r.queries, r.k_buf, r.candidates(cfg.recent), backend="triton")
    torch.testing.assert_close(got, reference.window_attention_score(r.queries, r.k_buf, r.candidates(cfg.recent)),
                               rtol=1e-4, atol=1e-6)
    assert grids["_window_lse"][1] == 2 and grids["_window_probs"][1] == 2  # KV heads, not 8 query heads
    assert grids["_window_lse"][2] == row_tiles  # 4 x R stacked rows, 64 per tile


@pytest.mark.parametrize("group", [1, 3, 4])
def test_bf16_pool_within_tolerance_of_fp32_reference(group: int) -> None:
    cfg = PolicyConfig(budget=128, recent=32)
    r = random_regions(cfg, n_req=2, n_layers=2, kv_heads=2, group=group, head_dim=64, dtype=torch.bfloat16)
    cand = r.candidates(cfg.recent)
    want = reference.window_attention_score(r.queries, r.k_buf, cand)  # fp32 math on the bf16 data
    got = ops.window_attention_score(r.queries, r.k_buf, cand, backend="triton")
    torch.testing.assert_close(got, want, rtol=BF16_RTOL, atol=BF16_ATOL)
    sketch = torch.randn((2, 2, 64, 16), device=DEVICE)
    torch.testing.assert_close(ops.cur_score(r.k_buf, r.v_buf, cand, sketch, backend="triton"),
                               reference.cur_score(r.k_buf, r.v_buf, cand, sketch), rtol=BF16_RTOL, atol=BF16_ATOL)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_queries_read_in_place_from_the_ring(backend: str) -> None:
    cfg = PolicyConfig(budget=64, recent=16)
    r = random_regions(cfg, n_req=3, n_layers=2, kv_heads=2, group=2, head_dim=16)
    assert r.queries is not None
    ring = torch.randn((6, *r.queries.shape[1:]), device=DEVICE)
    rows = torch.tensor([4, 1, 2], device=DEVICE)
    ring[rows] = r.queries
    cand = r.candidates(cfg.recent)
    want = reference.window_attention_score(r.queries, r.k_buf, cand)
    got = ops.window_attention_score(ring, r.k_buf, cand, query_rows=rows, backend=backend)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_key_redundancy_matches_the_pairwise_definition() -> None:
    """R-KV's redundancy without the [C, C] similarity matrix (O(C D) memory)."""
    cfg = PolicyConfig(budget=64, recent=16)
    r = random_regions(cfg, n_req=2, n_layers=2, kv_heads=2, head_dim=16)
    cand = r.candidates(cfg.recent)
    k = reference.gather_region(r.k_buf, cand).float()
    kn = k / (k.norm(dim=-1, keepdim=True) + 1e-8)
    sim = kn @ kn.transpose(-1, -2)
    sim.diagonal(dim1=-2, dim2=-1).zero_()
    torch.testing.assert_close(reference.key_redundancy(r.k_buf, cand), sim.mean(-1).softmax(-1),
                               rtol=1e-5, atol=1e-7)


class _LiveBytes(TorchDispatchMode):
    """Peak bytes of tensors allocated (not views) by torch ops while active and alive."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self.paused = False

    def _free(self, n: int) -> None:
        self.live -= n

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if self.paused:
            return out
        inputs = {a.untyped_storage().data_ptr() for a in torch.utils._pytree.tree_leaves((args, kwargs))
                  if isinstance(a, torch.Tensor)}
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs and t._base is None:
                n = t.untyped_storage().nbytes()
                self.live += n
                self.peak = max(self.peak, self.live)
                weakref.finalize(t, self._free, n)
        return out


@contextmanager
def _untracked_launches(mode: _LiveBytes, monkeypatch: pytest.MonkeyPatch, run: bool = True) -> Iterator[None]:
    # The Triton interpreter copies arguments with torch ops; a GPU launch does not.
    # ``run=False`` skips the kernel bodies: nothing in them is counted anyway, and no host
    # code reads their outputs' values (no .item(), no data-dependent shape), so the
    # allocations are the same; it keeps realistic shapes fast under the interpreter.
    for module in KERNEL_MODULES:
        real = module.launch

        def paused(*args: Any, _real: Any = real, **kw: Any) -> None:
            mode.paused = True
            try:
                if run:
                    _real(*args, **kw)
            finally:
                mode.paused = False

        monkeypatch.setattr(module, "launch", paused)
    yield


# (n_req, layers, kv_heads, group, head_dim, pool dtype, budget, recent)
ROUND_SHAPES = {
    "tiny": (3, 2, 2, 2, 16, torch.float32, 128, 32),
    # A real model's heads: temporaries that scale with head_dim (R-KV's normalised keys)
    # are invisible at D=16 next to the score maps.
    "d128-bf16": (4, 2, 8, 4, 128, torch.bfloat16, 256, 64),
}


@pytest.mark.parametrize("measure", [False, True], ids=["plain", "telemetry"])
@pytest.mark.parametrize("shape_id", list(ROUND_SHAPES))
@pytest.mark.parametrize("policy", sorted(n for n, c in POLICIES.items() if c.evicts) + ["vase/outlier_factor"])
def test_round_temporaries_fit_the_reserved_workspace(policy: str, shape_id: str, measure: bool,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A round's peak live bytes (scores, noise, selection and scratch, not only the query
    ring; with the telemetry, its window attention and evicted mass too) stay within
    ``workspace_bytes``, so none of it comes out of memory the KV pool holds."""
    n_req, layers, kv_heads, group, dim, dtype, budget, recent = ROUND_SHAPES[shape_id]
    name, _, outliers = policy.partition("/")
    cfg = PolicyConfig(policy=name, budget=budget, recent=recent, outlier_factor=3.0 if outliers else None)
    r = random_regions(cfg, n_req=n_req, n_layers=layers, kv_heads=kv_heads, group=group, head_dim=dim,
                       dtype=dtype)
    ring = (torch.zeros((n_req + 1, *r.queries.shape[1:]), dtype=r.queries.dtype, device=DEVICE)
            if r.queries is not None else None)
    if ring is not None:
        ring[1:] = r.queries
    regions = Regions(r.k_buf, r.v_buf, r.slots, r.seeds, r.rounds, queries=ring,
                      query_rows=torch.arange(1, n_req + 1, device=DEVICE) if ring is not None else None)
    pol = make_policy(cfg, backend="triton")
    mode = _LiveBytes()
    with _untracked_launches(mode, monkeypatch, run=shape_id == "tiny"), mode:
        selection = pol.selection(regions, measure=measure)
        ops.compact(regions.k_buf, regions.v_buf, regions.slots, selection.keep, backend="triton")
        del selection
    shape = RoundShape(n_req=n_req, n_layers=layers, q_heads=kv_heads * group, kv_heads=kv_heads, head_dim=dim,
                       itemsize=torch.tensor([], dtype=dtype).element_size())
    reserved = pol.workspace_bytes(shape, measure)
    assert mode.peak > 0
    assert mode.peak <= reserved, f"{policy}: a round allocated {mode.peak} bytes, {reserved} reserved"


def test_server_reserve_covers_every_policy_a_request_may_pick() -> None:
    server = PolicyConfig(policy="vase", budget=256, recent=64)
    shape = RoundShape(n_req=200, n_layers=4, q_heads=8, kv_heads=2, head_dim=64, itemsize=2)
    reserved = round_workspace_bytes(server, shape)
    for name in reachable_policies(server):
        pol = make_policy(server.replace(policy=name))
        assert pol.workspace_bytes(RoundShape(**{**shape.__dict__, "n_req": 32})) <= reserved
    # Bounded by the launch cap, not by the number of running requests.
    assert round_workspace_bytes(server, RoundShape(**{**shape.__dict__, "n_req": 10_000})) == reserved


def test_warm_up_launches_every_variant_requests_reach(monkeypatch: pytest.MonkeyPatch) -> None:
    """After the warm-up, random per-request budgets, policies and n_large launch no new
    kernel variant, so no round compiles one mid-serving."""
    server = PolicyConfig(policy="vase", budget=256, recent=32, sinks=2)
    layers, heads, dim, rows, cols = 2, 2, 16, 3, 300
    fused = torch.randn((layers, 2, rows * cols + 1, heads, dim), device=DEVICE)
    k = stacked_view([fused[i, 0] for i in range(layers)])
    v = stacked_view([fused[i, 1] for i in range(layers)])
    engine = RoundEngine(server, k, v, rows, 4, capture_queries=True, keep_state=True, backend="triton")
    sched = VaseScheduler(ServerSettings(server, 0), engine, FakePool(rows, cols))
    monkeypatch.setattr(_common, "LAUNCHED", set())
    before = fused.clone()
    assert sched.warm_up() == len(warmup_configs(server))
    warmed = set(_common.LAUNCHED)
    assert torch.equal(fused[:, :, 1:], before[:, :, 1:]), "warm-up touched a slot other than the padding slot 0"
    rng = random.Random(0)
    for _ in range(12):
        budget = rng.randrange(2 * server.recent, server.budget + 1, server.recent)
        cfg = server.replace(policy=rng.choice(reachable_policies(server)), budget=budget)
        if rng.random() < 0.3 and cfg.large:
            cfg = cfg.replace(n_large=rng.randrange(0, cfg.budget - cfg.recent - cfg.sinks + 1))
        r = random_regions(cfg, n_req=rng.randrange(1, 4), n_layers=layers, kv_heads=heads, group=2, head_dim=dim)
        # The scheduler measures every round (telemetry on by default): so does this one.
        selection = make_policy(cfg, backend="triton").selection(r, measure=sched.measures)
        ops.compact(r.k_buf, r.v_buf, r.slots, selection.keep, backend="triton")
        if selection.carry is not None:  # a stateful policy's scores move with the tokens
            state = torch.zeros((r.n_req, layers, heads, server.region_size), device=DEVICE)
            ops.carry_scores(state, torch.arange(r.n_req, device=DEVICE), selection.carry, selection.keep,
                             backend="triton")
    assert set(_common.LAUNCHED) <= warmed, sorted(set(_common.LAUNCHED) - warmed)
