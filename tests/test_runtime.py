"""EvictionRuntime and the stacked KV view, without SGLang."""

from __future__ import annotations

import pytest
import torch

from vase_sglang.config import PolicyConfig
from vase_sglang.kernels import reference
from vase_sglang.runtime import EvictionRuntime, RequestState, stacked_view


def _layers(n_layers: int = 3, slots: int = 50, heads: int = 2, dim: int = 8):
    fused = torch.randn((n_layers, 2, slots, heads, dim))
    return [fused[i, 0] for i in range(n_layers)], [fused[i, 1] for i in range(n_layers)]


def test_stacked_view_aliases_the_layers() -> None:
    k_layers, _ = _layers()
    k = stacked_view(k_layers)
    assert k.shape == (3, 50, 2, 8)
    k[2, 7, 1, 3] = 123.0
    assert k_layers[2][7, 1, 3] == 123.0


def test_stacked_view_refuses_separate_allocations() -> None:
    with pytest.raises(RuntimeError, match="one allocation"):
        stacked_view([torch.zeros(4, 2, 8), torch.zeros(4, 2, 8)])


def test_runtime_round_compacts_and_tracks_positions() -> None:
    cfg = PolicyConfig(policy="vase", budget=16, recent=4, sinks=2, seed=3)
    k_layers, v_layers = _layers(slots=cfg.region_size + 10)
    rt = EvictionRuntime(cfg, stacked_view(k_layers), stacked_view(v_layers), n_rows=4, q_heads=4,
                         capture_queries=True, backend="torch")
    lo = 5
    row_slots = torch.arange(1, 1 + lo + cfg.region_size)  # a req_to_token row: prompt then region
    st = RequestState(cfg=cfg, row=2, generation=1, lo=lo)
    rt.begin(st)
    # Decode queries land at ring slot (column - lo) % R.
    for col in range(lo, lo + cfg.region_size):
        q = torch.full((1, 4 * 8), float(col))
        rt.record_queries(0, torch.tensor([2]), torch.tensor([col + 1]), q)
    ring = rt.qbuf[2, 0, 0, :, 0]
    assert sorted(ring.tolist()) == [float(lo + cfg.budget + i) for i in range(cfg.recent)]
    region = row_slots[lo : lo + cfg.region_size]
    before_k, before_v = rt.k_buf.clone(), rt.v_buf.clone()
    prompt = row_slots[:lo]
    assert st.due(lo + cfg.region_size) and not st.due(lo + cfg.region_size - 1)
    rt.run_rounds([(st, region)])
    assert (st.rounds, st.evicted, st.delta, st.compacted) == (1, cfg.recent, cfg.recent, True)
    assert int(rt.delta_by_row[2]) == cfg.recent and rt.totals.rounds == 1
    assert torch.equal(rt.k_buf[:, prompt], before_k[:, prompt])  # the prompt's slots are never touched
    # The kept data equals what the policy chose, gathered from the old buffer.
    queries = rt.qbuf[torch.tensor([2])]
    from vase_sglang.policies import Regions, make_policy

    regions = Regions(before_k, before_v, region[None], seeds=[3], rounds=[0], queries=queries)
    keep = make_policy(cfg, backend="torch").select(regions)
    expect_k, expect_v = before_k.clone(), before_v.clone()
    reference.compact(expect_k, expect_v, region[None], keep)
    assert torch.equal(rt.k_buf, expect_k) and torch.equal(rt.v_buf, expect_v)
