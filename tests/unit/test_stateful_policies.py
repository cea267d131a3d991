"""Stateful policies (H2O, G-KV) in the adapter: each kept token's score follows it through
compaction, round after round, the tokens a round did not score start at 0, and a region
that restarts after a re-prefill starts from nothing."""

from __future__ import annotations

import pytest
import torch
from support.fakes import CFG, Q_HEADS, FakeBatch, FakeKV, FakeReq, make_scheduler

from vase_sglang.kernels import reference
from vase_sglang.plugin.scheduler import VaseScheduler

ROW, PROMPT = 2, 5


def _fill(sched: VaseScheduler, req: FakeReq, first: int, last: int, tag0: int) -> None:
    """Decode region positions [first, last): each token's V carries its tag in channel 0
    (tag0 + position), and its query goes to the ring."""
    slots = sched.req_to_token_pool.req_to_token[ROW]
    g = torch.Generator().manual_seed(first)
    for pos in range(first, last):
        col = PROMPT + pos
        sched.engine.v_buf[:, int(slots[col]), :, 0] = float(tag0 + pos)
        q = torch.randn((sched.engine.n_layers, Q_HEADS * sched.engine.head_dim), generator=g)
        for layer in range(sched.engine.n_layers):
            sched.engine.record_queries(layer, torch.tensor([ROW]), torch.tensor([col + 1]), q[layer : layer + 1])
    req.kv.kv_committed_len = req.kv.kv_allocated_len = PROMPT + last


def _tags(sched: VaseScheduler, n: int) -> torch.Tensor:
    """[layers, KV heads, n]: the tag of the token each of the region's first n places holds."""
    slots = sched.req_to_token_pool.req_to_token[ROW, PROMPT : PROMPT + n].long()
    return sched.engine.v_buf[:, slots, :, 0].permute(0, 2, 1)


def _expected_carry(policy: str, planted: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    if policy == "h2o":
        return planted + probs
    local = probs / probs.amax(-1, keepdim=True)
    return torch.maximum(planted * CFG.replace(policy="gkv").gkv_decay, local)


@pytest.mark.parametrize("policy", ["h2o", "gkv"])
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_planted_scores_follow_their_tokens_through_rounds(policy: str, backend: str) -> None:
    cfg = CFG.replace(policy=policy)
    sched = make_scheduler(cfg=cfg, backend=backend)
    req = FakeReq("a", ROW, PROMPT)
    sched.before_decode_alloc(FakeBatch([req]))  # starts the region
    assert sched.engine.score_state is not None and float(sched.engine.score_state[ROW].abs().max()) == 0
    c, b = cfg.budget, cfg.budget  # candidates at a round: the region's first B positions
    tag_of = {}  # tag -> planted or carried score per (layer, head)
    _fill(sched, req, 0, cfg.region_size, tag0=1000)
    for rnd in range(3):
        tags_before = _tags(sched, cfg.region_size)  # [L, H, B + R]
        # Plant distinct scores on the candidates at the first round; later rounds carry their own.
        if rnd == 0:
            sched.engine.score_state[ROW, :, :, :c] = 10.0 * (tags_before[..., :c] - 999)
        planted = sched.engine.score_state[ROW, :, :, :c].clone()
        slots = sched.req_to_token_pool.req_to_token[ROW, PROMPT : PROMPT + cfg.region_size].long()
        probs = reference.window_attention_probs(sched.engine.query_ring[[ROW]], sched.engine.k_buf, slots[None, :c])[0]
        want = _expected_carry(policy, planted, probs)  # [L, H, C], by position before the round
        tag_of = {(layer, head, int(tags_before[layer, head, p])): float(want[layer, head, p])
                  for layer in range(sched.engine.n_layers) for head in range(sched.engine.kv_heads) for p in range(c)}
        sched.before_decode_alloc(FakeBatch([req]))  # the round
        assert sched.record(req).rounds == rnd + 1
        tags_after = _tags(sched, b)
        state = sched.engine.score_state[ROW]
        for layer in range(sched.engine.n_layers):
            for head in range(sched.engine.kv_heads):
                for j in range(b):
                    tag = int(tags_after[layer, head, j])
                    # A kept candidate carries its own score; a kept recent token has none yet.
                    expected = tag_of.get((layer, head, tag), 0.0)
                    assert float(state[layer, head, j]) == pytest.approx(expected, rel=1e-5, abs=1e-6), (
                        layer, head, j, tag)
                assert float(state[layer, head, b:].abs().max()) == 0.0  # the places the next tokens fill
        # The recent window's tokens were kept unscored; R new tokens refill the region.
        _fill(sched, req, b, cfg.region_size, tag0=2000 + 100 * rnd)


def test_a_restarted_region_starts_with_no_scores() -> None:
    cfg = CFG.replace(policy="h2o")
    sched = make_scheduler(cfg=cfg)
    req = FakeReq("a", ROW, PROMPT)
    sched.before_decode_alloc(FakeBatch([req]))
    _fill(sched, req, 0, cfg.region_size, tag0=1)
    sched.before_decode_alloc(FakeBatch([req]))
    assert float(sched.engine.score_state[ROW].abs().max()) > 0
    # Retracted, re-prefilled into row 3 with 12 generated tokens: a new region, nothing scored;
    # the old row is reset when another region starts in it.
    req.retraction_count = 1
    sched.engine.score_state[3] = 5.0
    req.kv = FakeKV(3, PROMPT + 12, PROMPT + 12, PROMPT)
    sched.before_decode_alloc(FakeBatch([req]))
    assert float(sched.engine.score_state[3].abs().max()) == 0
    other = FakeReq("b", ROW, PROMPT)
    sched.before_decode_alloc(FakeBatch([other]))
    assert float(sched.engine.score_state[ROW].abs().max()) == 0


def test_a_stateful_policy_needs_a_server_with_score_state(monkeypatch: pytest.MonkeyPatch) -> None:
    from vase_sglang.plugin.options import request_options
    from vase_sglang.plugin.planning import keeps_state
    from vase_sglang.plugin.settings import ServerSettings
    from vase_sglang.plugin.telemetry import TelemetryOptions

    streaming = CFG.replace(policy="streamingllm")
    assert keeps_state(CFG) and keeps_state(streaming, telemetry=True) and not keeps_state(streaming)
    # telemetry on: queries captured, state kept
    assert request_options(ServerSettings(streaming), {"kv_policy": "h2o"}).cfg.policy == "h2o"
    # Without queries no stateful policy can run (each reads them): refused per request.
    with pytest.raises(ValueError, match="needs attention queries"):
        request_options(ServerSettings(streaming, telemetry=TelemetryOptions(enabled=False)), {"kv_policy": "gkv"})
