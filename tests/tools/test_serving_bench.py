"""The serving benchmark's arms and ratios without servers (``test_bench_serving`` runs it end to end)."""

from __future__ import annotations

import pytest

from vase_sglang.bench import serving


def _st(*args: str):
    parser = serving.build_parser()
    return serving.resolve(parser.parse_args(["--device", "cpu", *args]), parser)


def test_the_telemetry_comparison_runs_the_policy_with_telemetry_off_and_on() -> None:
    st = _st("--compare", "telemetry", "--kv-policy", "streamingllm", "--rounds", "3")
    off, on = serving.arms(st)
    assert (off, on) == ("streamingllm-telemetry-off", "streamingllm")
    flags_off, flags_on = serving.server_args(st, off, 1000), serving.server_args(st, on, 1000)
    def flag(flags: list[str], name: str) -> str:
        return flags[flags.index(name) + 1]

    assert flag(flags_off, "--kv-policy") == "streamingllm" == flag(flags_on, "--kv-policy")
    assert flag(flags_off, "--kv-telemetry") == "off"
    assert "--kv-telemetry" not in flags_on
    assert serving.arms(_st()) == ("none", "vase")


def _result(arm: str, k: int, tok_s: float, tpot: float) -> dict:
    return {"arm": arm, "pool": 500, "round": k, "output_tok_s": tok_s, "running_peak": 4,
            "tpot_s": {"p50": tpot}, "itl_s": {"p50": tpot}}


def test_ratios_are_the_median_of_the_per_round_ratios() -> None:
    results = [_result("vase-telemetry-off", 0, 100, 0.010), _result("vase", 0, 99, 0.0102),
               _result("vase-telemetry-off", 1, 80, 0.012), _result("vase", 1, 90, 0.0126),
               _result("vase-telemetry-off", 2, 100, 0.010), _result("vase", 2, 97, 0.0101)]
    (r,) = serving.ratios(results, ("vase-telemetry-off", "vase"))
    assert r["rounds"] == 3
    assert r["tpot_p50_vase_over_vase-telemetry-off"] == pytest.approx(1.02)
    assert r["throughput_vase_over_vase-telemetry-off"] == pytest.approx(0.99)
    assert r["tpot_p50_per_round"] == pytest.approx([1.02, 1.05, 1.01])


def test_a_compared_policy_of_none_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _st("--kv-policy", "none")
    assert "the compared arm must evict" in capsys.readouterr().err


def test_two_evicting_policies_compare_their_round_seconds(capsys: pytest.CaptureFixture[str]) -> None:
    st = _st("--baseline", "snapkv", "--kv-policy", "h2o")
    assert serving.arms(st) == ("snapkv", "h2o")
    assert serving.server_args(st, "snapkv", 1000)[-6:] == ["--kv-policy", "snapkv", "--kv-budget", "128",
                                                            "--kv-recent", "32"]
    results = [{**_result("snapkv", 0, 100, 0.010), "round_seconds": 2.0},
               {**_result("h2o", 0, 100, 0.010), "round_seconds": 2.5}]
    (r,) = serving.ratios(results, ("snapkv", "h2o"))
    assert r["round_seconds_h2o_over_snapkv"] == pytest.approx(1.25)
    # Against the full cache, which runs no rounds, there is no round ratio.
    (r,) = serving.ratios([{**_result("none", 0, 100, 0.01), "round_seconds": None},
                           {**_result("vase", 0, 100, 0.01), "round_seconds": 1.0}])
    assert r["round_seconds_vase_over_none"] is None
    for bad, message in ((["--baseline", "h2o", "--kv-policy", "h2o"], "the same policy"),
                         (["--baseline", "bogus"], "invalid policy='bogus'"),
                         (["--compare", "telemetry", "--baseline", "snapkv"], "--kv-telemetry off")):
        with pytest.raises(SystemExit):
            _st(*bad)
        assert message in capsys.readouterr().err
