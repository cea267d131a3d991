"""The memory an evicting server reserves before SGLang sizes its KV pool: the query ring, the
stateful policies' score state and one batched round's temporaries, in the dtype the pool
stores (what the ring and the scratch are allocated in), not the model's (the state is
fp32), with the telemetry's share when it is on."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vase_sglang.config import PolicyConfig
from vase_sglang.patches import memory
from vase_sglang.plugin.planning import (
    query_ring_bytes_per_request,
    round_workspace_bytes,
    score_state_bytes_per_request,
)
from vase_sglang.plugin.settings import export_config
from vase_sglang.plugin.telemetry import TelemetryOptions
from vase_sglang.policies import RoundShape

VASE = PolicyConfig(policy="vase", budget=256, recent=64)
# 64 request rows: past the 32 regions a round batches, so the ring and the round's
# temporaries scale differently and a reserve in the wrong dtype cannot match by chance.
LAYERS, Q_HEADS, KV_HEADS, HEAD_DIM, RUNNING = 36, 32, 8, 128, 63


def _configurator(kv_dtype: torch.dtype) -> SimpleNamespace:
    model = SimpleNamespace(num_attention_heads=Q_HEADS, num_hidden_layers=LAYERS, head_dim=HEAD_DIM,
                            dtype=torch.bfloat16, get_total_num_kv_heads=lambda: KV_HEADS)
    return SimpleNamespace(model_config=model, kv_cache_dtype=kv_dtype)


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch):
    import sglang.srt.runtime_context as runtime_context

    monkeypatch.setenv("VASE_SGLANG_CONFIG", "")
    export_config(VASE)
    args = SimpleNamespace(max_running_requests=RUNNING, tp_size=1)
    monkeypatch.setattr(runtime_context, "get_context", lambda: SimpleNamespace(server_args=args))


def _expected(itemsize: int, cfg: PolicyConfig = VASE, measure: bool = True) -> int:
    rows = RUNNING + 1
    ring = rows * query_ring_bytes_per_request(cfg, LAYERS, Q_HEADS, HEAD_DIM, itemsize, measure=measure)
    ring += rows * score_state_bytes_per_request(cfg, LAYERS, KV_HEADS, measure=measure)
    return ring + round_workspace_bytes(cfg, RoundShape(n_req=rows, n_layers=LAYERS, q_heads=Q_HEADS,
                                                        kv_heads=KV_HEADS, head_dim=HEAD_DIM, itemsize=itemsize,
                                                        total_kv_heads=KV_HEADS), measure=measure)


def _reserved(kv_dtype: torch.dtype) -> int:
    available = 10**12
    return available - memory._reserve_policy_memory(lambda c: available, _configurator(kv_dtype))


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float32])
def test_reserve_is_sized_in_the_kv_pool_dtype(server, kv_dtype: torch.dtype) -> None:
    assert _reserved(kv_dtype) == _expected(torch.empty((), dtype=kv_dtype).element_size())


def test_an_fp32_kv_cache_under_a_bf16_model_is_not_reserved_as_bf16(server) -> None:
    assert _expected(4) != _expected(2)  # the shape tells the two apart
    assert _reserved(torch.float32) == _expected(4)


def test_the_telemetry_reserves_a_query_ring_for_a_policy_that_reads_no_queries(server) -> None:
    curdkv = VASE.replace(policy="curdkv")
    export_config(curdkv)  # --kv-telemetry on (the default)
    assert _reserved(torch.bfloat16) == _expected(2, curdkv) > _expected(2, curdkv, measure=False)
    assert query_ring_bytes_per_request(curdkv, LAYERS, Q_HEADS, HEAD_DIM, 2) == 0
    export_config(curdkv, telemetry=TelemetryOptions(enabled=False))
    assert _reserved(torch.bfloat16) == _expected(2, curdkv, measure=False)


def test_the_score_state_is_one_fp32_per_region_position_when_a_request_may_run_a_stateful_policy(server) -> None:
    # vase captures queries, so a request may ask for h2o or gkv: every row keeps a state.
    per_request = 4 * LAYERS * KV_HEADS * VASE.region_size
    assert score_state_bytes_per_request(VASE, LAYERS, KV_HEADS) == per_request
    without = _reserved(torch.bfloat16) - (RUNNING + 1) * per_request
    assert without == (RUNNING + 1) * query_ring_bytes_per_request(VASE, LAYERS, Q_HEADS, HEAD_DIM, 2) + \
        round_workspace_bytes(VASE, RoundShape(n_req=RUNNING + 1, n_layers=LAYERS, q_heads=Q_HEADS, kv_heads=KV_HEADS,
                                               head_dim=HEAD_DIM, itemsize=2, total_kv_heads=KV_HEADS), measure=True)
    # A server that captures no queries can serve no stateful policy: no state.
    curdkv = VASE.replace(policy="curdkv")
    assert score_state_bytes_per_request(curdkv, LAYERS, KV_HEADS, measure=False) == 0
    assert score_state_bytes_per_request(curdkv, LAYERS, KV_HEADS, measure=True) == per_request
    assert score_state_bytes_per_request(VASE.replace(policy="none"), LAYERS, KV_HEADS) == 0
