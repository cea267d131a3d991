"""Fake SGLang objects with exactly the attributes the adapter reads (declared in
vase_sglang/plugin/contract.py), and a VaseScheduler over them: no SGLang, no server."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import torch

from vase_sglang.config import PolicyConfig
from vase_sglang.plugin import contract as sg
from vase_sglang.plugin.engine import RoundEngine, stacked_view
from vase_sglang.plugin.options import carry, request_options
from vase_sglang.plugin.scheduler import VaseScheduler
from vase_sglang.plugin.settings import ServerSettings

CFG = PolicyConfig(policy="vase", budget=16, recent=4, sinks=2)
LAYERS, HEADS, DIM, Q_HEADS = 3, 2, 8, 4


@dataclass
class FakeKV:
    req_pool_idx: int
    kv_committed_len: int
    kv_allocated_len: int
    cache_protected_len: int = 0  # columns the radix tree owns


@dataclass
class FakeParams:
    custom_params: dict[str, Any] | None = None
    sampling_seed: int | None = None
    max_new_tokens: int = 1000
    # Read by patches/guards/bodies.py, not by the adapter; here so the fake is a whole SamplingParams.
    n: int = 1
    top_k: int = -1
    stop_regex: str | list[str] | None = None


class FakeReq:
    def __init__(self, rid: str, row: int, prompt: int, custom: dict[str, Any] | None = None,
                 sampling_seed: int | None = None):
        if custom:  # what SamplingParams.verify leaves for the scheduler
            carry(custom, request_options(ServerSettings(CFG), custom))
        self.rid = rid
        self.sampling_params: sg.SamplingParams = FakeParams(custom, sampling_seed)
        self.kv: sg.ReqKvInfo = FakeKV(row, prompt, prompt, prompt)
        self.origin_input_ids: Sequence[int] = list(range(prompt))
        self.output_ids: Sequence[int] = []
        self.retraction_count = 0
        self.tokenizer: Any = None
        self.finished_reason: Any = None
        self.finished_len: int | None = None

    def finished(self) -> bool:
        return self.finished_reason is not None


class FakePool:
    def __init__(self, rows: int, cols: int):
        self.size = rows - 1
        self.req_to_token = torch.arange(rows * cols, dtype=torch.int32).reshape(rows, cols) + 1
        self.req_generation = torch.ones(rows, dtype=torch.int64)


@dataclass
class FakeAllocator:
    freed: list[torch.Tensor] = field(default_factory=list)

    def free(self, slots: torch.Tensor) -> None:
        self.freed.append(slots.clone())


class FakeBatch:
    def __init__(self, reqs: list[FakeReq]):
        self.reqs: list[sg.Req] = [*reqs]
        lens = torch.tensor([r.kv.kv_committed_len for r in reqs])
        self.seq_lens, self.seq_lens_cpu = lens.clone(), lens.clone()
        self.orig_seq_lens: torch.Tensor | None = lens.clone()
        self.seq_lens_sum: int | None = int(lens.sum())
        self.token_to_kv_pool_allocator: sg.TokenToKVPoolAllocator = FakeAllocator()


def make_scheduler(rows: int = 4, cols: int = 40, server_seed: int | None = None,
                   cfg: PolicyConfig = CFG, backend: str = "torch") -> VaseScheduler:
    """A VaseScheduler (the torch backend unless told) over a fake pool and random K/V."""
    pool = FakePool(rows, cols)
    fused = torch.randn((LAYERS, 2, rows * cols + 1, HEADS, DIM))
    k = stacked_view([fused[i, 0] for i in range(LAYERS)])
    v = stacked_view([fused[i, 1] for i in range(LAYERS)])
    engine = RoundEngine(cfg, k, v, rows, Q_HEADS, capture_queries=True, keep_state=True, backend=backend)
    return VaseScheduler(ServerSettings(cfg, server_seed), engine, pool)


def server_args(**given: Any) -> SimpleNamespace:
    """Every field of SGLang's ``ServerArgs`` at its default, ``given`` on top: read like the
    real record, without the resolution that building one runs (it loads the model config)."""
    import msgspec
    from sglang.srt.server_args import ServerArgs

    def default(f: Any) -> Any:  # model_path, the one required field, reads None
        if f.default_factory is not msgspec.NODEFAULT:
            return f.default_factory()
        return None if f.default is msgspec.NODEFAULT else f.default

    defaults = {f.name: default(f) for f in msgspec.structs.fields(ServerArgs)}
    unknown = set(given) - set(defaults)
    assert not unknown, f"not ServerArgs fields: {sorted(unknown)}"
    return SimpleNamespace(**{**defaults, **given})


if TYPE_CHECKING:
    # Each stand-in satisfies the Protocol of vase_sglang/plugin/contract.py it stands in for: mypy
    # checks tests/support (scripts/test.sh), so a fake that drifts from SGLang's shape fails.
    _req: sg.Req = FakeReq("r", 0, 1)
    _batch: sg.ScheduleBatch = FakeBatch([])
    _pool: sg.ReqToTokenPool = FakePool(1, 1)
    _allocator: sg.TokenToKVPoolAllocator = FakeAllocator()
