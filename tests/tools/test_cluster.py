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


def test_cpu_workers_side_by_side_get_their_own_cores_threads_and_a_passive_wait() -> None:
    from vase_sglang.server_process import cpu_share_env

    assert cpu_share_env(0, 2, 2) == {"SGLANG_CPU_OMP_THREADS_BIND": "0", "OMP_NUM_THREADS": "1",
                                      "OMP_WAIT_POLICY": "PASSIVE"}
    assert cpu_share_env(1, 2, 2)["SGLANG_CPU_OMP_THREADS_BIND"] == "1"
    assert cpu_share_env(1, 2, 8) == {"SGLANG_CPU_OMP_THREADS_BIND": "4-7", "OMP_NUM_THREADS": "4",
                                      "OMP_WAIT_POLICY": "PASSIVE"}
    assert cpu_share_env(2, 3, 2)["OMP_NUM_THREADS"] == "1"  # more workers than cores: one thread each


def test_a_cluster_gives_each_cpu_worker_its_share_unless_the_caller_set_it(tmp_path, monkeypatch) -> None:
    from vase_sglang.cluster import Cluster

    monkeypatch.setattr("os.cpu_count", lambda: 4)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cluster = Cluster("m", 2, tmp_path, [], env={"OMP_WAIT_POLICY": "ACTIVE"})
    assert [w.env["OMP_NUM_THREADS"] for w in cluster.workers] == ["2", "2"]
    assert [w.env["SGLANG_CPU_OMP_THREADS_BIND"] for w in cluster.workers] == ["0-1", "2-3"]
    assert all(w.env["OMP_WAIT_POLICY"] == "ACTIVE" for w in cluster.workers)
    assert "OMP_NUM_THREADS" not in Cluster("m", 1, tmp_path, []).workers[0].env
