"""Head sharding over tensor-parallel ranks, as SGLang's QKVParallelLinear does it."""

from __future__ import annotations

import pytest

from vase_sglang.sharding import head_shard

Q_HEADS = 32


@pytest.mark.parametrize("tp", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("kv", [1, 2, 4, 8])
def test_every_rank_holds_its_query_heads_and_their_kv_head(tp: int, kv: int) -> None:
    group = Q_HEADS // kv
    shards = [head_shard(Q_HEADS, kv, tp, rank) for rank in range(tp)]
    assert sum(s.q_heads for s in shards) == Q_HEADS
    covered = set()
    for rank, s in enumerate(shards):
        local_kv = set(range(s.kv_head_offset, s.kv_head_offset + s.kv_heads))
        covered |= local_kv
        # The rank's query heads (a contiguous slice) attend to exactly its local KV heads.
        q_global = range(rank * s.q_heads, (rank + 1) * s.q_heads)
        assert {q // group for q in q_global} == local_kv, (tp, kv, rank)
        assert s.kv_replicas == max(1, tp // kv) and s.total_kv_heads == kv
    assert covered == set(range(kv))
    # Ring shape: kv_heads * (Q / total_kv) would overcount local query heads under replication.
    if tp > kv:
        assert shards[0].q_heads < shards[0].kv_heads * group


def test_impossible_splits_are_refused() -> None:
    with pytest.raises(ValueError):
        head_shard(32, 8, 3, 0)
    with pytest.raises(ValueError):
        head_shard(32, 8, 4, 4)


@pytest.mark.parametrize("policy", ["random", "vase"])
def test_decisions_do_not_depend_on_the_tp_size(policy: str) -> None:
    """A rank holding KV heads [2, 4) of 4 keeps what the single-rank run keeps for them:
    noise is drawn per global head (drawn per local head, rank 1 would reuse heads 0-1's noise)."""
    import torch

    from vase_sglang.config import PolicyConfig
    from vase_sglang.policies import Regions, make_policy

    cfg = PolicyConfig(policy=policy, budget=16, recent=4, sinks=2)
    g = torch.Generator().manual_seed(0)
    n_req, n_layers, heads, group, d = 2, 2, 4, 2, 8
    keys = torch.randn((n_req, n_layers, heads, cfg.region_size, d), generator=g)
    values = torch.randn((n_req, n_layers, heads, cfg.region_size, d), generator=g)
    queries = torch.randn((n_req, n_layers, heads * group, cfg.recent, d), generator=g)
    full = Regions.from_dense(keys, values, queries, seeds=[5, 6], rounds=[0, 3])
    kept = make_policy(cfg, backend="torch").select(full)
    for lo in (0, 2):
        shard = Regions(full.k_buf[:, :, lo : lo + 2], full.v_buf[:, :, lo : lo + 2], full.slots, seeds=[5, 6],
                        rounds=[0, 3], queries=queries[:, :, lo * group : (lo + 2) * group],
                        head_offset=lo, total_heads=heads)
        assert torch.equal(make_policy(cfg, backend="torch").select(shard), kept[:, :, lo : lo + 2])
