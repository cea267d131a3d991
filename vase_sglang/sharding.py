"""Which attention heads one tensor-parallel rank holds (pure arithmetic, no SGLang).

SGLang shards query heads evenly over the TP ranks; KV heads too while there are at
least as many as ranks, and past that every rank holds one KV head, replicated over
``tp_size / total_kv`` consecutive ranks (``QKVParallelLinear``: ``num_kv_heads = 1``,
``num_kv_head_replicas = tp / total_kv``, shard ``tp_rank // replicas``). The eviction
round needs the local query-head count (the ring's shape; not ``kv_heads * group``,
which is wrong under replication) and the global index of the local KV heads, so that
the noise of a (request, layer, KV head) is the same whatever the TP size.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HeadShard:
    q_heads: int  # query heads on this rank
    kv_heads: int  # KV heads on this rank
    kv_head_offset: int  # global index of this rank's first KV head
    total_kv_heads: int
    kv_replicas: int  # ranks holding each KV head (1 unless tp_size > total_kv_heads)


def head_shard(total_q_heads: int, total_kv_heads: int, tp_size: int, tp_rank: int) -> HeadShard:
    if tp_size < 1 or not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_rank {tp_rank} is not a rank of tp_size {tp_size}")
    if total_q_heads % tp_size or total_q_heads % total_kv_heads:
        raise ValueError(f"{total_q_heads} query heads cannot be split over tp_size {tp_size} "
                         f"and {total_kv_heads} KV heads")
    if tp_size >= total_kv_heads:
        if tp_size % total_kv_heads:
            raise ValueError(f"tp_size {tp_size} is not a multiple of the {total_kv_heads} KV heads")
        replicas = tp_size // total_kv_heads
        return HeadShard(total_q_heads // tp_size, 1, tp_rank // replicas, total_kv_heads, replicas)
    if total_kv_heads % tp_size:
        raise ValueError(f"{total_kv_heads} KV heads cannot be split over tp_size {tp_size}")
    kv = total_kv_heads // tp_size
    return HeadShard(total_q_heads // tp_size, kv, tp_rank * kv, total_kv_heads, 1)
