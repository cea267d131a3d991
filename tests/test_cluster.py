"""The cluster launcher's pieces that need no server (the gateway e2e test runs the rest)."""

from __future__ import annotations

import pytest

from vase_sglang.cluster import Gateway, main, prefix_hit_rate


def test_prefix_hit_rate_is_cached_over_prompt_tokens_between_readings() -> None:
    before = {"sglang:prompt_tokens_total": 100.0, "sglang:cached_tokens_total": 10.0}
    after = {"sglang:prompt_tokens_total": 300.0, "sglang:cached_tokens_total": 160.0}
    assert prefix_hit_rate(before, after) == {"prompt_tokens": 200, "cached_tokens": 150, "hit_rate": 0.75}
    assert prefix_hit_rate(after, after)["hit_rate"] is None  # no traffic: no rate, not 0


def test_gateway_command_routes_with_health_checks(tmp_path) -> None:
    gw = Gateway(["http://127.0.0.1:1", "http://127.0.0.1:2"], "cache_aware", tmp_path, port=4000)
    cmd = " ".join(gw.cmd)
    assert "-m smg launch" in cmd and "--policy cache_aware" in cmd and "--port 4000" in cmd
    assert "--worker-urls http://127.0.0.1:1 http://127.0.0.1:2" in cmd
    assert "--health-check-interval-secs 1" in cmd


def test_cluster_cli_refuses_zero_workers(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--workers", "0"])
    assert "--workers must be >= 1" in capsys.readouterr().err
