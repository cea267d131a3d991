"""The serving benchmark (``python -m vase_sglang.bench.serving``) end to end, tiny settings.

One pool of 400 tokens: the full cache holds one request of 16 + 256 tokens at a time,
vase (B = 128, R = 32: 16 + 160 reserved each) holds both. The load comes from SGLang's
``sglang.benchmark.serving``, running requests, KV tokens and retractions from the
servers' ``/metrics``, the eviction rounds from ``GET /kv_policy``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MODULE = "vase_sglang.bench.serving"
POOL, REQUESTS, OUTPUT_LEN = 400, 2, 256
BUDGET, RECENT = 128, 32
# Two CPU server start-ups (run together), then per arm SGLang's benchmark client (its imports
# take 10-20 s on a small CPU) and a batch of 2 x 256 tokens: ~150 s on 2 shared cores.
TIMEOUT = 330


def _cwd(tmp_path: Path) -> Path:
    # The suite tests the installed package (cwd outside the checkout); an install that
    # predates bench/serving.py runs the module from the source tree instead.
    return tmp_path if importlib.util.find_spec(MODULE) is not None else REPO


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _bench(tmp_path: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", MODULE, *args], cwd=_cwd(tmp_path), capture_output=True, text=True,
                          timeout=timeout)


def test_help_and_bad_options(tmp_path: Path) -> None:
    out = _bench(tmp_path, "--help")
    assert out.returncode == 0 and "--kv-budget" in out.stdout and "--pools" in out.stdout
    for args, needle in [(("--kv-budget", "100"), "multiple of recent=32"),
                         (("--requests", "0"), "--requests"),
                         (("--pools", "100"), "cannot hold one request"),
                         (("--output-len", "1"), "--output-len"),
                         (("--kv-seed", "-1"), "--kv-seed"),
                         (("--pools", "2y"), "--pools"),
                         (("--server-args", "--max-total-tokens 5"), "--max-total-tokens"),
                         (("--model-path", str(tmp_path / "missing")), "--model-path")]:
        bad = _bench(tmp_path, *args, "--device", "cpu")
        assert bad.returncode == 2, (args, bad.stdout, bad.stderr)
        lines = bad.stderr.strip().splitlines()
        assert len(lines) == 1 and "error:" in lines[0] and needle in lines[0], (args, bad.stderr)


@pytest.mark.server
def test_serving_benchmark_both_arms(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", MODULE, "--model-path", str(tiny_model), "--device", "cpu", "--pools", str(POOL),
           "--requests", str(REQUESTS), "--output-len", str(OUTPUT_LEN), "--kv-budget", str(BUDGET),
           "--kv-recent", str(RECENT), "--out", str(out)]
    proc = subprocess.Popen(cmd, cwd=_cwd(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        stdout, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the benchmark stops its servers on SIGTERM
        stdout, _ = proc.communicate(timeout=90)
        pytest.fail(f"benchmark did not finish in {TIMEOUT}s:\n{stdout[-4000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, stdout[-4000:]
    assert "reproduce: " in stdout and "x none" in stdout

    doc = json.loads((out / "serving_bench.json").read_text())
    assert {"command", "settings", "results", "ratios", "failures", "plot", "plot_skipped"} <= doc.keys()
    assert doc["failures"] == []
    assert doc["settings"]["pools"] == [POOL] and doc["settings"]["output_len"] == OUTPUT_LEN
    # matplotlib comes with the test extra, so the plot must be there.
    assert doc["plot_skipped"] is None and Path(doc["plot"]).stat().st_size > 0
    by_arm = {r["arm"]: r for r in doc["results"]}
    assert sorted(by_arm) == ["none", "vase"] and len(doc["results"]) == 2
    for arm, r in by_arm.items():
        assert r["pool"] == POOL and r["max_total_num_tokens"] == POOL, arm
        assert r["requests"] == REQUESTS and r["completed"] == REQUESTS and r["errors"] == 0, (arm, r["error_messages"])
        assert r["output_tokens"] == REQUESTS * OUTPUT_LEN, arm
        # metrics_samples: /metrics scrapes during the batch, where the running/KV peaks come from
        for key in ("wall_s", "output_tok_s", "running_peak", "running_mean", "kv_tokens_peak", "metrics_samples"):
            assert isinstance(r[key], (int, float)) and r[key] > 0, (arm, key, r[key])
        for key in ("ttft_s", "tpot_s", "itl_s"):
            stats = r[key]
            assert stats["p50"] > 0 and stats["p99"] >= stats["p50"], (arm, key, stats)
        assert r["ttft_s"]["n"] == REQUESTS and r["tpot_s"]["n"] == REQUESTS
        assert isinstance(r["retractions"], int) and r["retractions"] >= 0, arm
        assert r["running_peak"] <= REQUESTS and r["kv_tokens_peak"] <= POOL, arm
        assert r["output_lens"] == [OUTPUT_LEN] * REQUESTS, arm
        # The numbers come from SGLang's own benchmark result, kept beside the logs.
        sglang = json.loads(Path(r["sglang_bench_result"]).read_text().splitlines()[-1])
        assert sglang["completed"] == REQUESTS and sglang["total_output_tokens"] == REQUESTS * OUTPUT_LEN, arm
        assert sglang["output_throughput"] == r["output_tok_s"] and sglang["duration"] == r["wall_s"], arm
        assert not _group_alive(r["server_pid"]), f"{arm} server process group still running"
    # vase evicted (256 generated > B + R = 160). Each request evicts at least 255 - (B + R) = 95
    # tokens and at most 256 - B = 128, so a total of at least 2 x 95 means every request evicted.
    totals = by_arm["vase"]["kv_policy_state"]["totals"]
    assert totals["tokens_evicted"] >= REQUESTS * (OUTPUT_LEN - 1 - (BUDGET + RECENT)), totals
    assert totals["eviction_rounds"] >= REQUESTS, totals
    # ... so each request holds at most prompt + B + R slots
    assert by_arm["vase"]["kv_tokens_peak"] <= REQUESTS * (16 + BUDGET + RECENT)
    # The round cost is measured in the same run: its seconds and share of the batch's wall time.
    vase = by_arm["vase"]
    assert 0 < vase["round_seconds"] <= vase["round_seconds_total"] and vase["round_seconds"] < vase["wall_s"]
    assert vase["round_share_of_wall"] == pytest.approx(vase["round_seconds"] / vase["wall_s"])
    assert by_arm["none"]["round_seconds_total"] is None and by_arm["none"]["round_share_of_wall"] is None
    (ratio,) = doc["ratios"]
    assert ratio["pool"] == POOL
    assert ratio["throughput_vase_over_none"] > 0
    # At an equal pool vase runs both requests at once; the full cache never holds both
    # for long (SGLang may admit the second and retract it), so on average it runs fewer.
    assert by_arm["vase"]["running_peak"] == REQUESTS, by_arm["vase"]
    assert by_arm["vase"]["running_mean"] > by_arm["none"]["running_mean"], doc["results"]
    assert ratio["peak_running_vase_over_none"] >= 1
