"""CUDA graphs, checked without a GPU.

SGLang captures the decode forward pass in CUDA graphs by default. What must hold:

* rounds move KV data and shorten rows: they run in the scheduler before the step's
  allocation, never inside capture (and refuse if they ever do);
* the hooks that run *inside* the captured forward (query recording) must read all
  per-request state from device tensors, so that a replay, which re-runs the recorded
  kernels and not the Python, sees new regions, new lengths and new offsets. The test
  traces them once with ``make_fx`` (ops recorded, Python not re-run, like a capture) and
  replays the trace after rounds and re-prefills: it must agree with eager calls;
* what SGLang copies into its graph buffers at replay is what the hooks change: positions
  (shifted to logical ones when the ForwardBatch is built), seq_lens (shortened by a
  round), and padded rows point at row 0, which no request owns.
"""

from __future__ import annotations

import inspect
import re

import pytest
import torch
from support.fakes import CFG, DIM, HEADS, LAYERS, Q_HEADS, FakeBatch, FakePool, FakeReq, make_scheduler
from torch.fx.experimental.proxy_tensor import make_fx

from vase_sglang.plugin import scheduler as scheduler_module
from vase_sglang.plugin.engine import RoundEngine, stacked_view
from vase_sglang.plugin.scheduler import VaseScheduler
from vase_sglang.plugin.settings import ServerSettings


def test_a_round_inside_capture_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    sched = make_scheduler()
    req = FakeReq("a", 1, 5)
    sched.before_decode_alloc(FakeBatch([req]))
    req.kv.kv_committed_len = req.kv.kv_allocated_len = 5 + CFG.region_size
    monkeypatch.setattr(scheduler_module, "_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="inside CUDA-graph capture"):
        sched.before_decode_alloc(FakeBatch([req]))


def test_capturing_is_false_outside_a_capture() -> None:
    assert scheduler_module._capturing() is False


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA-graph capture needs a GPU")
def test_capturing_is_true_inside_a_capture() -> None:
    seen = []
    x = torch.zeros(1, device="cuda")
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        seen.append(scheduler_module._capturing())
        x.add_(1)
    assert seen == [True] and scheduler_module._capturing() is False


def test_forward_hooks_replay_like_a_captured_graph() -> None:
    """Record once, replay after the state changed: the replay equals eager calls."""
    sched = make_scheduler(rows=4, cols=60)
    a, b = FakeReq("a", 1, 5), FakeReq("b", 2, 9)
    sched.before_decode_alloc(FakeBatch([a, b]))
    rows = torch.tensor([1, 2])
    lens = torch.tensor([6, 10])
    q = torch.randn(2, Q_HEADS * DIM)
    pos = torch.tensor([5, 9])
    # The "capture": per batch size (SGLang captures one graph per padded size), one traced
    # call per hook, with the state as it is at start-up.
    graphs = {}
    for bs in (2, 4):
        r, s, x, p = rows.repeat(bs // 2), lens.repeat(bs // 2), q.repeat(bs // 2, 1), pos.repeat(bs // 2)
        graphs[bs] = (make_fx(lambda r, s, x: sched.engine.record_queries(1, r, s, x))(r, s, x),
                      make_fx(lambda p, r: sched.engine.logical_positions(p, r))(p, r))

    def check(rows: torch.Tensor, lens: torch.Tensor) -> None:
        record, positions = graphs[rows.shape[0]]
        x = torch.randn(rows.shape[0], Q_HEADS * DIM)
        saved = sched.engine.query_ring.clone()
        sched.engine.record_queries(1, rows, lens, x)
        eager = sched.engine.query_ring.clone()
        sched.engine.query_ring.copy_(saved)  # in place: the trace holds this very tensor
        record(rows, lens, x)
        assert torch.equal(sched.engine.query_ring, eager)
        p = lens - 1
        assert torch.equal(positions(p, rows), sched.engine.logical_positions(p, rows))

    check(rows, torch.tensor([7, 11]))
    # A round on request a: its row is shortened and its positions shift by R.
    a.kv.kv_committed_len = a.kv.kv_allocated_len = 5 + CFG.region_size
    batch = FakeBatch([a, b])
    sched.before_decode_alloc(batch)
    assert int(sched.engine.position_offset_by_row[1]) == CFG.recent
    check(rows, batch.seq_lens + 1)
    # b is retracted and re-prefilled into another row: a new region after its prompt.
    b.retraction_count = 1
    b.kv.req_pool_idx, b.kv.kv_committed_len, b.kv.kv_allocated_len = 3, 30, 30
    sched.req_to_token_pool.req_generation[3] += 1
    sched.before_decode_alloc(FakeBatch([a, b]))
    assert sched.record(b).region_start == 9
    check(torch.tensor([1, 3]), torch.tensor([5 + CFG.budget + 1, 31]))
    # A padded graph batch: extra rows point at row 0 with SGLang's fill length.
    check(torch.tensor([1, 3, 0, 0]), torch.tensor([5 + CFG.budget + 2, 32, 1, 1]))


def _source(path: str) -> str:
    import importlib

    module_name, _, attr = path.partition(":")
    obj = importlib.import_module(module_name)
    for part in attr.split(".") if attr else []:
        obj = getattr(obj, part)
    return inspect.getsource(obj)


def test_sglang_replay_copies_what_the_hooks_change() -> None:
    """The upstream behaviour the graph safety relies on, read from sglang 0.5.23."""
    pytest.importorskip("sglang")
    runner = "sglang.srt.model_executor.runner.decode_cuda_graph_runner:DecodeCudaGraphRunner"
    # Each replay loads the live ForwardBatch into the graph's buffers through the registry
    # (_copy_replay_inputs is only the pre-planned speculative path).
    assert "self.buffer_registry.fill_from(\n            forward_batch," in _source(runner + ".load_batch")
    # The decode registry copies positions (where the logical shift was applied), seq_lens and
    # req_pool_indices from the ForwardBatch (copy_from_fb defaults to True); padded lanes get
    # position 0, row 0 and SGLang's fill length.
    registry = _source("sglang.srt.model_executor.cuda_graph_buffer_registry")
    assert re.search(r"copy_from_fb: bool = True", registry)
    decode_slots = _source("sglang.srt.model_executor.cuda_graph_buffer_registry:build_decode_registry")
    for slot, padding in (("positions", "ZERO"), ("req_pool_indices", "ZERO"), ("seq_lens", "FILL_SENTINEL")):
        found = re.search(rf'GraphSlot\(\s*"{slot}",[^)]*\)', decode_slots)
        assert found and f"padding_policy=PaddingPolicy.{padding}" in found.group(0), slot
        assert "copy_from_fb=False" not in found.group(0), slot
    # Row 0 of req_to_token is never handed to a request: padded rows write only there.
    assert "list(range(1, self._alloc_size))" in _source("sglang.srt.mem_cache.memory_pool:ReqToTokenPool")
    # The adapter (and its query hook) exists before the graphs are captured.
    init = _source("sglang.srt.managers.scheduler")
    assert init.index("self.tp_worker.alloc_memory_pool(") < init.index("self.tp_worker.init_cuda_graphs()")
    # seq_lens_sum, which a round sets to None, is recomputed from the shortened lengths.
    assert "batch.seq_lens_sum = int(seq_lens_cpu.sum())" in _source(
        "sglang.srt.model_executor.forward_batch_info:ForwardBatch.init_new")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (scripts/gpu_check.sh runs it)")
def test_query_recording_under_a_real_cuda_graph() -> None:
    """The same property with torch.cuda.graph: capture once, replay after the per-row
    offsets and the inputs changed, compare with eager calls."""
    dev = torch.device("cuda")
    fused = torch.randn((LAYERS, 2, 200, HEADS, DIM), device=dev)
    k = stacked_view([fused[i, 0] for i in range(LAYERS)])
    v = stacked_view([fused[i, 1] for i in range(LAYERS)])
    engine = RoundEngine(CFG, k, v, 4, Q_HEADS, capture_queries=True, keep_state=True, backend="triton")
    sched = VaseScheduler(ServerSettings(CFG, 0), engine, FakePool(4, 40))
    rows = torch.tensor([1, 2], device=dev)
    lens = torch.tensor([6, 10], device=dev)
    q = torch.randn(2, Q_HEADS * DIM, device=dev)
    pos = lens - 1
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream, as SGLang does
        sched.engine.record_queries(0, rows, lens, q)
        sched.engine.logical_positions(pos, rows)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sched.engine.record_queries(0, rows, lens, q)
        out = sched.engine.logical_positions(pos, rows)
    gen = torch.Generator(device=dev).manual_seed(0)
    for step in range(5):
        sched.engine.position_offset_by_row[1:3] += CFG.recent * step
        new_rows = torch.tensor([[1, 2], [2, 1], [3, 0]][step % 3], device=dev)
        new_lens = torch.randint(20, 40, (2,), device=dev, generator=gen)
        new_q = torch.randn(2, Q_HEADS * DIM, device=dev, generator=gen)
        saved = sched.engine.query_ring.clone()
        sched.engine.record_queries(0, new_rows, new_lens, new_q)
        eager_ring, eager_pos = sched.engine.query_ring.clone(), sched.engine.logical_positions(new_lens - 1, new_rows)
        sched.engine.query_ring.copy_(saved)
        rows.copy_(new_rows)
        lens.copy_(new_lens)
        q.copy_(new_q)
        pos.copy_(new_lens - 1)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(sched.engine.query_ring, eager_ring) and torch.equal(out, eager_pos)
