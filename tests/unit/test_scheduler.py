"""The VaseScheduler adapter, without SGLang: fake requests, batch, pool and allocator that
have only the attributes the adapter reads (declared in vase_sglang/plugin/contract.py)."""

from __future__ import annotations

import gc
import tracemalloc

import pytest
import torch
from support.fakes import (
    CFG,
    DIM,
    LAYERS,
    Q_HEADS,
    FakeBatch,
    FakeKV,
    FakeReq,
    make_scheduler,
)

from vase_sglang.config import PolicyConfig
from vase_sglang.kernels import reference
from vase_sglang.plugin.engine import stacked_view
from vase_sglang.plugin.options import identity_seed
from vase_sglang.plugin.scheduler import VaseScheduler
from vase_sglang.policies import Regions, make_policy


def _decode_until_round(sched: VaseScheduler, reqs: list[FakeReq]) -> FakeBatch:
    """Grow every request's region token by token until it is full, then run the step with the round."""
    batch = FakeBatch(reqs)
    sched.before_decode_alloc(batch)  # starts the regions
    for req in reqs:
        req.kv.kv_committed_len += CFG.region_size
        req.kv.kv_allocated_len = req.kv.kv_committed_len
    batch = FakeBatch(reqs)
    sched.before_decode_alloc(batch)
    return batch


def test_stacked_view_aliases_the_layers() -> None:
    fused = torch.randn((3, 2, 50, 2, 8))
    k = stacked_view([fused[i, 0] for i in range(3)])
    assert k.shape == (3, 50, 2, 8)
    k[2, 7, 1, 3] = 123.0
    assert fused[2, 0, 7, 1, 3] == 123.0


def test_stacked_view_refuses_separate_allocations() -> None:
    with pytest.raises(RuntimeError, match="one allocation"):
        stacked_view([torch.zeros(4, 2, 8), torch.zeros(4, 2, 8)])


def test_round_compacts_frees_the_tail_and_shortens_the_row() -> None:
    sched = make_scheduler()
    lo, row = 5, 2
    req = FakeReq("a", row, lo, {"kv_seed": 3})
    batch = FakeBatch([req])
    sched.before_decode_alloc(batch)
    st = sched.record(req)
    assert (st.row, st.region_start, st.seed) == (row, lo, 3)
    # Decode queries land at ring slot (column - lo) % R.
    for col in range(lo, lo + CFG.region_size):
        sched.engine.record_queries(0, torch.tensor([row]), torch.tensor([col + 1]), torch.full((1, Q_HEADS * DIM),
                                                                                         float(col)))
    ring = sched.engine.query_ring[row, 0, 0, :, 0]
    assert sorted(ring.tolist()) == [float(lo + CFG.budget + i) for i in range(CFG.recent)]
    region = sched.req_to_token_pool.req_to_token[row, lo : lo + CFG.region_size].long()
    prompt = sched.req_to_token_pool.req_to_token[row, :lo].long()
    before_k, before_v = sched.engine.k_buf.clone(), sched.engine.v_buf.clone()
    queries = sched.engine.query_ring[torch.tensor([row])].clone()

    req.kv.kv_committed_len = req.kv.kv_allocated_len = lo + CFG.region_size
    batch = FakeBatch([req])
    sched.before_decode_alloc(batch)

    assert (st.rounds, st.evicted, st.compacted) == (1, CFG.recent, True)
    assert int(sched.engine.position_offset_by_row[row]) == CFG.recent and sched.totals.rounds == 1
    # The R tail slots are freed and the row ends at lo + B.
    (freed,) = batch.token_to_kv_pool_allocator.freed
    assert torch.equal(freed, region[CFG.budget :])
    assert req.kv.kv_committed_len == req.kv.kv_allocated_len == lo + CFG.budget
    assert batch.seq_lens.tolist() == batch.seq_lens_cpu.tolist() == [lo + CFG.budget] and batch.seq_lens_sum is None
    assert torch.equal(sched.engine.k_buf[:, prompt], before_k[:, prompt])  # the prompt's slots are never touched
    # The kept data equals what the policy chose with the request's seed.
    regions = Regions(before_k, before_v, region[None], seeds=[3], rounds=[0], queries=queries)
    keep = make_policy(CFG, backend="torch").select(regions)
    expect_k, expect_v = before_k.clone(), before_v.clone()
    reference.compact(expect_k, expect_v, region[None], keep)
    assert torch.equal(sched.engine.k_buf, expect_k) and torch.equal(sched.engine.v_buf, expect_v)
    # Positions stay logical, the tree never takes a compacted column, growth is bounded by the region.
    logical = sched.engine.logical_positions(torch.tensor([lo + CFG.budget]), torch.tensor([row]))
    assert logical.item() == lo + CFG.region_size
    assert sched.checkpoint_limit(req, lo + CFG.budget) == lo
    assert sched.checkpoint_limit(req, lo) is None
    assert sched.growth_bound(req) == CFG.recent
    counters = sched.counters(req)
    assert (counters.evicted_tokens, counters.eviction_rounds, counters.reprefilled_tokens) == (CFG.recent, 1, "")


def test_a_round_with_an_empty_query_ring_is_counted() -> None:
    sched = make_scheduler()
    req = FakeReq("a", 1, 2)
    _decode_until_round(sched, [req])  # no record_queries: the backend was not hooked
    assert sched.summary()["rounds_without_queries"] == 1
    fed = FakeReq("b", 2, 2)
    sched.before_decode_alloc(FakeBatch([fed]))
    sched.engine.record_queries(0, torch.tensor([2]), torch.tensor([3]), torch.ones((1, Q_HEADS * DIM)))
    fed.kv.kv_committed_len = fed.kv.kv_allocated_len = 2 + CFG.region_size
    sched.before_decode_alloc(FakeBatch([fed]))
    assert sched.summary()["rounds_without_queries"] == 1 and sched.totals.rounds == 2


def test_reprefill_starts_a_new_region_and_keeps_the_counters() -> None:
    sched = make_scheduler()
    req = FakeReq("a", 1, 5)
    _decode_until_round(sched, [req])
    st = sched.record(req)
    assert st.rounds == 1 and int(sched.engine.position_offset_by_row[1]) == CFG.recent
    # Retracted and re-prefilled into another row: prompt 5 + 12 generated tokens (fewer
    # than B + R: no round yet), the tree owning the prompt only. The region restarts
    # after the prompt.
    req.retraction_count = 1
    req.kv = FakeKV(3, 17, 17, 5)
    sched.before_decode_alloc(FakeBatch([req]))
    assert (st.row, st.region_start, st.compacted, st.rounds, st.evicted) == (3, 5, False, 1, CFG.recent)
    assert int(sched.engine.position_offset_by_row[3]) == 0 and st.reprefilled == [12]
    assert sched.counters(req).reprefilled_tokens == "12" and st.region_len == 12


def test_a_reprefill_whose_first_token_finishes_the_request_is_reported() -> None:
    """No decode step follows it, so no region starts: the report counts it all the same
    (the reference decoder must re-prefill there too to compute that last token)."""
    sched = make_scheduler()
    req = FakeReq("a", 1, 5)
    _decode_until_round(sched, [req])
    req.retraction_count = 1
    req.kv = FakeKV(3, 17, 17, 5)  # re-prefilled in row 3: prompt 5 + 12 generated tokens
    req.output_ids = list(range(13))  # the re-prefill's token was the last one
    req.finished_reason = "length"
    sched.after_tokens(req, 1)
    assert sched.counters(req).reprefilled_tokens == "12"
    sched.after_tokens(req, 0)  # counted once
    assert sched.counters(req).reprefilled_tokens == "12"
    # A decode step's token in the same row is no re-prefill.
    other = FakeReq("b", 2, 5)
    _decode_until_round(sched, [other])
    other.output_ids, other.finished_reason = [1], "length"
    sched.after_tokens(other, 1)
    assert sched.counters(other).reprefilled_tokens == ""


def test_the_tree_takes_only_the_prompt_of_a_retracted_request() -> None:
    sched = make_scheduler()
    req = FakeReq("a", 1, 5)
    assert sched.checkpoint_limit(req, 30) is None  # not retracted, not compacted: exact KV may be shared
    req.retraction_count = 1
    assert sched.checkpoint_limit(req, 30) == 5 and sched.checkpoint_limit(req, 5) is None
    stock = FakeReq("b", 2, 5, {"kv_policy": "none"})
    stock.retraction_count = 1
    assert sched.checkpoint_limit(stock, 30) is None


def test_a_tree_owned_prefix_longer_than_the_prompt_stays_outside_the_region() -> None:
    sched = make_scheduler()
    req = FakeReq("a", 1, 5)
    req.retraction_count = 1
    req.kv = FakeKV(1, 30, 30, 8)  # another request's output, shared through the tree
    sched.before_decode_alloc(FakeBatch([req]))
    assert sched.record(req).region_start == 8


def test_after_a_reprefill_one_round_brings_the_region_back_to_budget() -> None:
    """A re-prefilled history is the request's region, not a protected prefix (which would be
    unbounded): the prefill records its last R queries and the first decode step runs the round."""
    sched = make_scheduler(rows=4, cols=200)
    prompt, history = 5, 3 * CFG.region_size
    req = FakeReq("a", 1, prompt)
    req.retraction_count = 1
    total = prompt + history
    # The re-prefill: the tree held the prompt, the history was extended (computed) again.
    queries = torch.randn((history, Q_HEADS * DIM))
    for layer in range(LAYERS):
        sched.engine.record_extend_queries(layer, torch.tensor([2]), torch.tensor([total]), torch.tensor([history]),
                                           queries)
    ring = sched.engine.query_ring[2, 0].transpose(0, 1).reshape(CFG.recent, -1)  # [R, Hq * D] by slot
    for col in range(total - CFG.recent, total):
        assert torch.equal(ring[col % CFG.recent], queries[col - prompt])
    req.kv = FakeKV(2, total, total, prompt)
    region = sched.req_to_token_pool.req_to_token[2, prompt:total].long()
    batch = FakeBatch([req])
    sched.before_decode_alloc(batch)
    st = sched.record(req)
    removed = history - CFG.budget
    assert (st.region_start, st.reprefilled, st.rounds, st.evicted) == (prompt, [history], 1, removed)
    assert int(sched.engine.position_offset_by_row[st.row]) == removed
    assert req.kv.kv_committed_len == prompt + CFG.budget and batch.seq_lens.tolist() == [prompt + CFG.budget]
    (freed,) = batch.token_to_kv_pool_allocator.freed
    assert torch.equal(freed, region[CFG.budget :])
    assert sched.summary()["rounds_without_queries"] == 0
    # The next round is the usual one: B + R -> B.
    assert not st.round_due(prompt + CFG.budget + CFG.recent - 1) and st.round_due(prompt + CFG.budget + CFG.recent)


def test_prefill_queries_of_several_requests_land_in_their_rows() -> None:
    sched = make_scheduler(rows=4, cols=60)
    # Two requests in one prefill batch: 3 and 9 new tokens after prefixes of 10 and 2.
    q = torch.arange(12, dtype=torch.float32)[:, None].expand(12, Q_HEADS * DIM).contiguous()
    sched.engine.record_extend_queries(0, torch.tensor([1, 3]), torch.tensor([13, 11]), torch.tensor([3, 9]), q)
    by_slot = sched.engine.query_ring[:, 0, 0, :, 0]  # [rows, R]: the token index written at each slot
    assert {c % CFG.recent: by_slot[1, c % CFG.recent].item() for c in (10, 11, 12)} == {2: 0.0, 3: 1.0, 0: 2.0}
    assert [by_slot[3, c % CFG.recent].item() for c in range(7, 11)] == [8.0, 9.0, 10.0, 11.0]


def test_admission_region_is_set_only_while_admitting() -> None:
    sched = make_scheduler()
    evicting, stock = FakeReq("a", 1, 5), FakeReq("b", 2, 5, {"kv_policy": "none"})
    assert sched.admitting_region is None
    with sched.admitting(evicting) as region:
        assert region == sched.admitting_region == CFG.region_size
    assert sched.admitting_region is None
    with sched.admitting(stock) as region:
        assert region is None
    assert sched.growth_bound(evicting) is None  # not started: SGLang's own estimate


def test_distinct_seeds_share_one_policy_object() -> None:
    sched = make_scheduler(rows=101, cols=30)
    reqs = [FakeReq(f"r{i}", i + 1, 2, {"kv_seed": i}) for i in range(100)]
    _decode_until_round(sched, reqs)
    assert sched.engine.policy_cache_size == 1 and sched.totals.rounds == 100
    assert sorted(sched.record(r).seed for r in reqs) == list(range(100))


def _kept_after_one_round(sched: VaseScheduler, reqs: list[FakeReq]) -> list[torch.Tensor]:
    """The K data each request's region holds after one round, when all regions start equal."""
    pool = sched.req_to_token_pool.req_to_token
    lo = 2
    src = pool[reqs[0].kv.req_pool_idx, lo : lo + CFG.region_size].long()
    for r in reqs[1:]:
        dst = pool[r.kv.req_pool_idx, lo : lo + CFG.region_size].long()
        sched.engine.k_buf[:, dst], sched.engine.v_buf[:, dst] = sched.engine.k_buf[:, src], sched.engine.v_buf[:, src]
    _decode_until_round(sched, reqs)
    return [sched.engine.k_buf[:, pool[r.kv.req_pool_idx, lo : lo + CFG.budget].long()].clone() for r in reqs]


def test_requests_without_kv_seed_draw_independent_noise_and_kv_seed_reproduces() -> None:
    torch.manual_seed(0)
    sched = make_scheduler()
    a, b = FakeReq("rid-a", 1, 2), FakeReq("rid-b", 2, 2)
    ka, kb = _kept_after_one_round(sched, [a, b])
    assert sched.record(a).seed == identity_seed("rid-a") != sched.record(b).seed
    assert not torch.equal(ka, kb), "two concurrent requests drew the same eviction noise"
    # An explicit kv_seed reproduces a request's choice, whatever its id.
    torch.manual_seed(0)
    sched2 = make_scheduler()
    c, d = FakeReq("rid-c", 1, 2, {"kv_seed": sched.record(a).seed}), FakeReq("rid-d", 2, 2, {"kv_seed": 5})
    kc, _ = _kept_after_one_round(sched2, [c, d])
    assert torch.equal(kc, ka)


def test_seed_precedence_request_then_server_then_identity() -> None:
    sched = make_scheduler(server_seed=11)
    assert sched.record(FakeReq("x", 1, 2)).seed == 11
    assert sched.record(FakeReq("y", 1, 2, {"kv_seed": 4})).seed == 4
    free = make_scheduler()
    assert free.record(FakeReq("z", 1, 2, sampling_seed=9)).seed == identity_seed("z", 9) == identity_seed("w",
                                                                                                                  9)


def test_unvalidated_kv_fields_fail_loudly() -> None:
    sched = make_scheduler()
    req = FakeReq("a", 1, 2)
    req.sampling_params.custom_params = {"kv_budget": 8}  # no stamp: verify never ran
    with pytest.raises(RuntimeError, match="without validation"):
        sched.record(req)


def test_request_state_goes_with_the_request() -> None:
    sched = make_scheduler()
    req = FakeReq("a", 1, 2)
    _decode_until_round(sched, [req])
    assert sched.summary()["tracked_requests"] == 1
    del req
    gc.collect()
    assert sched.summary()["tracked_requests"] == 0


def test_a_reused_request_id_gets_a_record_of_its_own() -> None:
    """A client may reuse a finished request's id while SGLang still holds the old Req: the
    new request runs its own options from a fresh record, and the old one's going does
    not take the new record with it."""
    sched = make_scheduler()
    old = FakeReq("same", 1, 2)
    _decode_until_round(sched, [old])
    new = FakeReq("same", 2, 2, {"kv_policy": "streamingllm", "kv_seed": 9})
    first = sched.record(old)
    rec = sched.record(new)
    assert rec is not first and (rec.cfg.policy, rec.seed, rec.rounds) == ("streamingllm", 9, 0)
    assert sched.record(old) is first and first.rounds == 1  # the old request's report stays its own
    assert sched.requests.started(new) is None and sched.requests.get("same") is rec
    assert sched.summary()["tracked_requests"] == 2
    del old, first
    gc.collect()
    assert sched.requests.get("same") is rec and sched.record(new) is rec
    assert sched.summary()["tracked_requests"] == 1


@pytest.mark.parametrize("policy", ["streamingllm", "vase"])
def test_round_statistics_stay_bounded_over_10000_rounds(policy: str) -> None:
    """streamingllm's round only compacts; vase's also scores the window attention and the
    value range and draws noise: both paths run 10,000 times without growing."""
    sched = make_scheduler(cfg=PolicyConfig(policy=policy, budget=16, recent=4, sinks=2))
    req = FakeReq("a", 1, 2)
    full = 2 + CFG.region_size

    def rounds(n: int) -> None:
        for _ in range(n):
            req.kv.kv_committed_len = req.kv.kv_allocated_len = full
            sched.before_decode_alloc(FakeBatch([req]))

    sched.before_decode_alloc(FakeBatch([req]))  # the region starts after the 2-token prompt
    rounds(100)  # warm every allocation path once
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    rounds(10_000)
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    assert sched.totals.rounds == 10_100 and sched.record(req).rounds == 10_100
    # A per-round leak leaves >= 1 live object per round (a list of round latencies would hold
    # 10,000 floats, ~320 KB). What survives here is a few hundred objects of torch's and
    # the interpreter's own caching, independent of the number of rounds.
    diffs = after.compare_to(before, "filename")
    ours = [d for d in diffs if "vase_sglang" in d.traceback[0].filename or "/kernels/" in d.traceback[0].filename]
    live = sum(d.count_diff for d in ours)
    total = sum(d.size_diff for d in diffs)
    assert live < 1_000, f"{live} objects allocated by vase_sglang survived 10,000 rounds: {ours[:5]}"
    assert total < 128 * 1024, f"memory grew by {total} bytes over 10,000 rounds"
    s = sched.summary()
    assert s["batched_rounds"] == 10_100
    assert 0 < s["round_latency_ms_p50"] <= s["round_latency_ms_p99"] <= s["round_latency_ms_max"]
