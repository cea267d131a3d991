"""What a GPU server compiles, checked without a GPU (``vase_sglang.compile_check``).

* no round compiles mid-decode: after the warm-up, rounds over regions of any length (the
  first round after a re-prefill of G generated tokens) launch only the variants the
  warm-up compiled, by Triton's own CUDA specialization (constexprs, dtypes and the
  divisibility of every int argument), not only by constexprs;
* a selection wider than the warmed block runs the torch twin, with the same result;
* a head wider than the compile check covers is refused, naming the limit;
* the report's failure rules.
"""

from __future__ import annotations

import pytest
import torch
from support.constants import DEVICE
from support.fakes import FakePool

from vase_sglang import compile_check as cc
from vase_sglang.config import PolicyConfig
from vase_sglang.kernels import ops, reference
from vase_sglang.plugin.engine import RoundEngine, stacked_view
from vase_sglang.plugin.planning import reachable_policies
from vase_sglang.plugin.scheduler import VaseScheduler
from vase_sglang.plugin.settings import ServerSettings
from vase_sglang.plugin.telemetry import TelemetryOptions

LAYERS, KV_HEADS, GROUP, DIM = 2, 2, 2, 16


def _scheduler(server: PolicyConfig, cols: int) -> VaseScheduler:
    rows = 3
    fused = torch.randn((LAYERS, 2, rows * cols + 1, KV_HEADS, DIM), device=DEVICE)
    k = stacked_view([fused[i, 0] for i in range(LAYERS)])
    v = stacked_view([fused[i, 1] for i in range(LAYERS)])
    engine = RoundEngine(server, k, v, rows, KV_HEADS * GROUP, capture_queries=True, keep_state=True,
                         backend="triton")
    sched = VaseScheduler(ServerSettings(server, 0, telemetry=TelemetryOptions(enabled=True)), engine,
                          FakePool(rows, cols))
    assert sched.engine.query_ring is not None
    sched.engine.query_ring.normal_()  # attention that is not uniform, as after real decode steps
    return sched


def _labels(variants: dict[str, cc.Variant]) -> list[str]:
    return sorted(v.label for v in variants.values())


def test_rounds_after_reprefills_of_any_length_compile_nothing_new() -> None:
    server = PolicyConfig(policy="vase", budget=128, recent=32, sinks=2)
    # Region lengths past B + R: a re-prefill's first round. 1 and 37 make the region (the
    # slots row stride) not a multiple of 16; 3 * B + 5 needs a wider selection block than
    # the largest budget's, so it must select with the torch twin.
    extra = (1, 37, 3 * server.budget + 5)
    sched = _scheduler(server, cols=server.region_size + max(extra) + 1)
    with cc.recording() as warmed:
        sched.warm_up()
    assert any(v.name == "_select_kernel" for v in warmed.values())
    rows = torch.ones(1, dtype=torch.int64, device=DEVICE)
    slots_row = sched.req_to_token_pool.req_to_token[1].to(DEVICE)
    with cc.recording() as later:
        for name in reachable_policies(server):
            for budget in (server.budget, server.budget - server.recent):  # a request may ask for less
                cfg = server.replace(policy=name, budget=budget)
                for n in extra:
                    slots = slots_row[: cfg.region_size + n].unsqueeze(0).long()
                    newest = torch.tensor([(slots.shape[1] - 1) % server.recent], device=DEVICE)
                    engine = sched.engine
                    engine.select_and_compact(engine.policy(cfg), slots, rows, [0], [0], sched.measures, newest)
    assert later, "the rounds launched no kernel: nothing was checked"
    new = {key: v for key, v in later.items() if key not in warmed}
    assert not new, f"rounds after a re-prefill compile new variants: {_labels(new)}"


def test_a_selection_wider_than_the_warmed_block_runs_the_torch_twin() -> None:
    gen = torch.Generator(device="cpu").manual_seed(0)
    fill, reserve = torch.rand((2, 3, 300), generator=gen), torch.rand((2, 3, 300), generator=gen)
    noise = torch.empty((2, 3, 300)).exponential_(generator=gen)
    expected = reference.select(fill, 2, 10, 20, reserve, noise)
    with cc.recording() as launched:
        out = ops.select(fill, 2, 10, 20, reserve, noise, backend="triton", max_block=256)
    assert not launched, f"launched {_labels(launched)} for a row wider than max_block"
    assert torch.equal(out, expected)
    with cc.recording() as launched:
        out = ops.select(fill, 2, 10, 20, reserve, noise, backend="triton", max_block=512)
    assert [v.named_constexprs()["BLOCK"] for v in launched.values()] == [512]
    assert torch.equal(out, expected)


def test_heads_wider_than_the_checked_tiles_are_refused_by_name() -> None:
    queries = torch.zeros((1, 1, 2, 4, 512), device=DEVICE)
    k = torch.zeros((1, 8, 1, 512), device=DEVICE)
    slots = torch.arange(8, device=DEVICE).unsqueeze(0)
    with pytest.raises(ValueError, match="head_dim 512 is above 256"):
        ops.window_attention_probs(queries, k, slots, backend="triton")


def _row(**kw: object) -> dict[str, object]:
    row: dict[str, object] = {"variant": "_k[BLOCK=64]", "arch": "sm_90", "settings": ["g/bfloat16/R64/B512"],
                              "smallest_budget": 512, "registers": 96, "stack": 0, "local": 0, "shared": 1024,
                              "shared_limit": 232_448}
    row.update(kw)
    return row


def test_the_check_fails_on_errors_shared_memory_and_spills_within_the_budget() -> None:
    assert cc.failures([_row(), _row(arch="sm_80")]) == []
    assert cc.failures([_row(smallest_budget=8192, local=64)]) == []  # beyond the spill-free budget
    found = cc.failures([_row(error="CompilationError: bad\nmore"), _row(shared=300_000), _row(stack=256),
                         _row(arch="sm_80", local=8)])
    assert len(found) == 4
    assert "does not compile: CompilationError: bad" in found[0]
    assert "300,000 bytes of shared memory, above the 232,448-byte" in found[1]
    assert "spills (256 stack + 0 local bytes" in found[2]
    assert "on sm_80: spills (0 stack + 8 local bytes" in found[3]
