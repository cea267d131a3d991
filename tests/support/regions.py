"""Builders for random regions used by several test modules."""

from __future__ import annotations

import torch

from support.constants import DEVICE
from vase_sglang.config import PolicyConfig
from vase_sglang.policies import Regions


def random_regions(
    cfg: PolicyConfig,
    *,
    n_req: int = 2,
    n_layers: int = 2,
    kv_heads: int = 2,
    group: int = 2,
    head_dim: int = 16,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    seeds: list[int] | None = None,
) -> Regions:
    g = torch.Generator().manual_seed(seed)
    length = cfg.region_size
    shape = (n_req, n_layers, kv_heads, length, head_dim)
    keys = torch.randn(shape, generator=g)
    values = torch.randn(shape, generator=g)
    # A few large-range value vectors, like the outliers VaSE protects.
    values[..., 5::7, :] *= 4.0
    queries = torch.randn((n_req, n_layers, kv_heads * group, cfg.recent, head_dim), generator=g)
    regions = Regions.from_dense(
        keys.to(DEVICE, dtype),
        values.to(DEVICE, dtype),
        queries.to(DEVICE, dtype),
        seeds=seeds if seeds is not None else list(range(100, 100 + n_req)),
        rounds=[0] * n_req,
        shuffle_slots=g,
    )
    return regions
