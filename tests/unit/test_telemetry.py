"""The telemetry's pure parts: the signal's statistics, the loop detector against the
character-level definition, the KL mappings, and the adapter's per-request and fleet view."""

from __future__ import annotations

import dataclasses
import random
from types import SimpleNamespace

import pytest
import torch
from support.fakes import CFG, FakeBatch, FakeReq, make_scheduler

from vase_sglang.config import PolicyConfig
from vase_sglang.plugin.telemetry import FleetTelemetry, TelemetryOptions, TelemetryReport, merge
from vase_sglang.telemetry import EvictedAttention, KLEstimator, KLMapping, Loop, LoopDetector, find_text_loop
from vase_sglang.telemetry.estimator import fit_isotonic

# A toy tokenizer: token i is the word WORDS[i] (1 to 7 characters).
WORDS = ["a", "bb", "ccc", " the", " cat", " sat", " on", " mat", ".", "\n", "Wait,", " let", " me", " check",
         " again", "!", " 42", " x", "yy", " zzzzzzz"]


def text_of(ids) -> str:
    return "".join(WORDS[i] for i in ids)


def test_statistics_of_the_signal() -> None:
    s = EvictedAttention()
    assert s.statistic("mean", 100) is None  # no round yet
    s.add(0.2, generated=40)  # a round before output token 41
    s.add(0.4, generated=60)
    assert s.statistic("mean", 100) == pytest.approx(0.3)
    assert s.statistic("max", 100) == pytest.approx(0.4)
    # 0.2 holds for tokens 41..60 (20 tokens), 0.4 for 61..100 (40), nothing before: over 100 tokens.
    assert s.statistic("per_token", 100) == pytest.approx((0.2 * 20 + 0.4 * 40) / 100)
    # Every token after a round sees that round's signal added to the earlier ones'.
    assert s.statistic("cumulative", 100) == pytest.approx((0.2 * 60 + 0.4 * 40) / 100)
    with pytest.raises(ValueError, match="unknown statistic"):
        s.statistic("median", 100)


def _looping(prefix: list[int], phrase: list[int], copies: int, suffix: list[int] = ()) -> list[int]:
    return [*prefix, *(phrase * copies), *suffix]


def _first_phrase(phrase: list[int]) -> int:
    """Tokens of the phrase's shortest prefix of at least 10 characters: in a repeated phrase,
    the first n-gram whose 5th occurrence completes."""
    return next(k for k in range(1, len(phrase) + 1) if len(text_of(phrase[:k])) >= 10)


def test_a_planted_loop_is_found_at_the_fifth_occurrence_of_its_first_phrase() -> None:
    rng = random.Random(0)
    prefix = [rng.randrange(len(WORDS)) for _ in range(57)]
    phrase = [10, 11, 12, 13, 14]  # "Wait, let me check again": 24 characters
    tokens = _looping(prefix, phrase, 8)
    det = LoopDetector(text_of)
    found_after = next(n for n, t in enumerate(tokens) if det.feed([t]) is not None)
    loop = det.loop
    first = _first_phrase(phrase)  # "Wait, let me": 12 characters, 3 tokens
    # Found in the 5th copy, once "Wait, let me" has occurred 5 times; it starts at the 1st
    # copy (or earlier, if the random prefix happens to hold the phrase).
    assert loop is not None and found_after == len(prefix) + 4 * len(phrase) + first - 1 == loop.detected_at
    assert loop.start <= len(prefix) and (loop.phrase_tokens, loop.phrase_chars) == (first, 12)
    assert det.feed(tokens) is None and det.loop == loop  # reported once


def test_a_loop_found_mid_phrase_starts_where_the_repetition_does() -> None:
    # " on check againWait,": " check again" (12 characters, 2 tokens) is the first run to
    # occur 5 times, in the 5th copy; the repetition starts one token before its first copy.
    prefix, phrase = [0, 1, 2, 3, 4], [6, 13, 14, 10]
    loop = LoopDetector(text_of).feed(_looping(prefix, phrase, 8))
    assert loop == Loop(start=len(prefix), phrase_tokens=2, phrase_chars=12, detected_at=len(prefix) + 16 + 2)
    # A prefix that ends like the phrase belongs to the repetition.
    loop = LoopDetector(text_of).feed(_looping([0, 1, 2, 14, 10], phrase, 8))
    assert loop is not None and loop.start == 3


def test_a_short_phrase_must_repeat_as_a_phrase_of_ten_characters() -> None:
    # "bb" (2 characters) loops only once "bbbbbbbbbb" (10 characters) has 5 copies: 25 tokens.
    det = LoopDetector(text_of)
    assert det.feed([1] * 24) is None
    loop = det.feed([1])
    assert loop is not None and loop.detected_at == 24 and loop.start == 0
    # A repeated unit longer than 40 characters: its pieces of 10-40 characters repeat.
    unit = [19, 13, 14, 19, 13, 14, 16]  # " zzzzzzz check again" twice and " 42": 43 characters
    assert len(text_of(unit)) == 43
    loop = LoopDetector(text_of).feed(unit * 20)
    assert loop is not None and find_text_loop(text_of((unit * 20)[: loop.detected_at + 1])) is not None
    # A phrase that recurs with other text between its occurrences is a loop too.
    spaced = [19, 13, 14, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 17, 18, 16]
    loop = LoopDetector(text_of).feed(spaced * 5)
    assert loop is not None and loop.start == 0 and find_text_loop(text_of(spaced * 5)) is not None
    # Blanks are not a phrase.
    assert LoopDetector(text_of).feed([9] * 200) is None and find_text_loop("\n" * 200) is None


def test_ordinary_outputs_are_not_loops() -> None:
    rng = random.Random(1)
    for _ in range(20):
        tokens = [rng.randrange(len(WORDS)) for _ in range(600)]
        assert LoopDetector(text_of).feed(tokens) is None
        assert find_text_loop(text_of(tokens)) is None


@pytest.mark.parametrize("seed", range(30))
def test_the_token_detector_agrees_with_the_character_definition_on_planted_loops(seed: int) -> None:
    rng = random.Random(seed)
    phrase = [rng.randrange(len(WORDS)) for _ in range(rng.randint(1, 12))]
    copies = rng.randint(2, 12)
    prefix = [rng.randrange(len(WORDS)) for _ in range(rng.randint(0, 40))]
    tokens = _looping(prefix, phrase, copies)
    found = LoopDetector(text_of).feed(tokens)
    if found is not None:  # a token loop is a character loop
        assert find_text_loop(text_of(tokens[: found.detected_at + 1])) is not None
    chars = len(text_of(phrase))
    multiple = -(-10 // chars)
    if multiple * chars <= 40 and copies >= 5 * multiple:  # the phrase (or its multiple) repeats 5 times
        assert found is not None


def test_mapping_interpolates_and_holds_its_ends() -> None:
    m = KLMapping((0.1, 0.2, 0.4), (0.01, 0.03, 0.03), "x", 9)
    assert m(0.0) == 0.01 and m(0.15) == pytest.approx(0.02) and m(0.3) == pytest.approx(0.03) and m(9) == 0.03
    with pytest.raises(ValueError, match="non-decreasing"):
        KLMapping((0.1, 0.2), (0.5, 0.1), "x", 2)


def test_isotonic_fit_is_monotone_and_least_squares() -> None:
    fit = fit_isotonic([0.1, 0.2, 0.3, 0.4, 0.4], [1.0, 3.0, 2.0, 5.0, 4.0], "t")
    assert fit.x == (0.1, 0.2, 0.3, 0.4) and fit.y == pytest.approx((1.0, 2.5, 2.5, 4.5)) and fit.points == 5


def test_estimator_round_trips_and_falls_back_to_the_model_wide_mapping() -> None:
    model = KLMapping((0.0, 1.0), (0.0, 1.0), "model-wide", 10)
    pair = KLMapping((0.0, 1.0), (0.0, 2.0), "vase-outliers B=64", 5)
    est = KLEstimator("per_token", model, {("vase-outliers", 64): pair},
                      {"vase": {"policy": "vase"}, "vase-outliers": {"policy": "vase", "outlier_factor": 5.0}})
    again = KLEstimator.from_dict(est.to_dict())
    assert again == est
    assert again.mapping_for("vase", 5.0, 64) is again.per_config["vase-outliers", 64]
    assert again.mapping_for("vase", None, 64).label == "model-wide"  # plain vase at 64 was not fitted apart
    assert again.mapping_for("vase", 5.0, 128).label == "model-wide"


# ---- the adapter ------------------------------------------------------------------------


def _decode_steps(sched, reqs, steps: int, rng: random.Random, token=None) -> None:
    """Decode steps as SGLang runs them: rounds before the allocation, one token per request."""
    for _ in range(steps):
        batch = FakeBatch(reqs)
        sched.before_decode_alloc(batch)
        for r in reqs:
            r.kv.kv_committed_len += 1
            r.kv.kv_allocated_len += 1
            r.output_ids.append(token(r) if token else rng.randrange(len(WORDS)))
            sched.after_tokens(r, 1)
        sched.after_decode_alloc(FakeBatch(reqs))


def _scheduler_with_estimator(**options):
    sched = make_scheduler()
    sched.settings = dataclasses.replace(sched.settings, telemetry=TelemetryOptions(**options))
    for row in range(sched.engine.query_ring.shape[0]):  # non-zero queries: rounds read them
        sched.engine.query_ring[row] = torch.randn(sched.engine.query_ring.shape[1:])
    return sched


def test_rounds_report_the_evicted_attention_of_each_request() -> None:
    est = KLEstimator("mean", KLMapping((0.0, 1.0), (0.0, 2.0), "model-wide", 4), source="/x/cal.json")
    sched = _scheduler_with_estimator(estimator=est)
    reqs = [FakeReq("a", 1, 5), FakeReq("b", 2, 5, custom={"kv_policy": "streamingllm"})]
    _decode_steps(sched, reqs, 40, random.Random(0))
    for r in reqs:
        rep = sched.telemetry_report(r)
        st = sched.record(r)
        assert st.rounds >= 5 and st.telemetry.signal.rounds == st.rounds
        assert 0 < rep.evicted_attention <= rep.evicted_attention_max <= 1
        assert rep.estimated_kl == pytest.approx(2 * rep.evicted_attention)
        assert rep.kl_mapping.startswith("cal.json: model-wide isotonic (4 requests) at mean")
    # Each round's signal is the mean over layers and heads of what the policy measures.
    assert sched.summary()["telemetry"]["measures_rounds"]


def test_a_request_that_never_evicts_reports_no_signal_and_zero_estimated_kl() -> None:
    est = KLEstimator("mean", KLMapping((0.0, 1.0), (0.0, 2.0), "model-wide", 4))
    sched = _scheduler_with_estimator(estimator=est)
    r = FakeReq("a", 1, 5, custom={"kv_policy": "none"})
    _decode_steps(sched, [r], 30, random.Random(0))
    rep = sched.telemetry_report(r)
    assert (rep.evicted_attention, rep.estimated_kl, rep.loop) == (None, 0.0, False)


def test_stop_on_loop_per_request_overrides_the_server() -> None:
    sched = _scheduler_with_estimator(stop_on_loop=False)
    phrase = [10, 11, 12, 13, 14]
    stopping = FakeReq("s", 1, 5, custom={"kv_stop_on_loop": True})
    going_on = FakeReq("g", 2, 5)
    for r in (stopping, going_on):  # the scheduler's tokenizer: the phrase's length in characters
        r.tokenizer = SimpleNamespace(decode=text_of)
    stops = {}
    for step in range(60):
        for r in (stopping, going_on):
            r.output_ids.append(phrase[step % len(phrase)])
            loop = sched.after_tokens(r, 1)
            if loop is not None:
                stops.setdefault(r.rid, (step, loop))
    found = 4 * len(phrase) + _first_phrase(phrase) - 1  # the 5th "Wait, let me"
    assert list(stops) == ["s"] and stops["s"][0] == found and stops["s"][1].start == 0
    assert sched.record(going_on).telemetry.loop is not None  # detected, not stopped
    assert sched.telemetry_report(going_on).loop_start == 0


def test_a_finished_request_is_counted_once_in_the_fleet_totals() -> None:
    sched = _scheduler_with_estimator()
    r = FakeReq("a", 1, 5)
    _decode_steps(sched, [r], 30, random.Random(0))
    r.finished_reason = object()
    for _ in range(3):
        sched.telemetry_report(r)
    row = sched.summary()["telemetry"]["by_config"][f"vase B={CFG.budget}"]
    assert row["requests"] == row["requests_evicted"] == 1 and row["loops"] == 0
    assert row["evicted_attention_mean"] == pytest.approx(sched.telemetry_report(r).evicted_attention, abs=1e-6)


def test_fleet_totals_merge_across_schedulers() -> None:
    fleet = [FleetTelemetry(), FleetTelemetry()]
    cfg = PolicyConfig(policy="vase", budget=128, recent=32)
    for f, signal, loop in ((fleet[0], 0.1, False), (fleet[1], 0.3, True), (fleet[1], None, False)):
        f.observe(cfg, TelemetryReport(signal, signal, loop, 7 if loop else -1, 0.02 if signal else 0.0), loop)
    merged = merge([f.summary() for f in fleet])["vase B=128"]
    assert (merged["requests"], merged["requests_evicted"], merged["loops"], merged["loop_stops"]) == (3, 2, 1, 1)
    assert merged["evicted_attention_mean"] == pytest.approx(0.2) and merged["loop_rate"] == pytest.approx(1 / 3)
    assert merged["estimated_kl_mean"] == pytest.approx(0.02)


def test_meta_info_fields_follow_the_server_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """--kv-telemetry off sends no telemetry field; without a calibration no estimate field."""
    from vase_sglang.patches import io, runtime

    sched = _scheduler_with_estimator()
    monkeypatch.setattr(runtime, "_adapter", sched)
    req = FakeReq("a", 1, 5)
    sched.settings = dataclasses.replace(sched.settings, telemetry=TelemetryOptions(enabled=False))
    assert io._telemetry_fields([req]) == {}
    sched.settings = dataclasses.replace(sched.settings, telemetry=TelemetryOptions())
    assert set(io._telemetry_fields([req])) == {"kv_evicted_attention", "kv_evicted_attention_max", "kv_loop",
                                                "kv_loop_start"}
    est = KLEstimator("mean", KLMapping((0.0, 1.0), (0.0, 2.0), "model-wide", 4))
    sched.settings = dataclasses.replace(sched.settings, telemetry=TelemetryOptions(estimator=est))
    fields = io._telemetry_fields([req])
    assert fields["kv_estimated_kl"] == [[0.0]] and "no eviction round" in fields["kv_kl_mapping"][0][0]
