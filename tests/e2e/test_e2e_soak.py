"""Soak, short version (results/README.md documents the long run).

90 s of the mixed Locust load (8 users; long outputs of 150 tokens and short ones of 16,
shared prefix, n > 1, client disconnects, per-request overrides) against a server on the
bundled model with SGLang's leak checks on (``--kv-budget 96 --kv-recent 32``), run in
this process by ``vase_sglang.bench.soak.run``, the function behind ``python -m
vase_sglang.bench.soak``: RSS at most 32 MiB above its value after the 30 s warm-up, 0 KV
slots in use when idle, 0 HTTP 5xx, no crash, a bounded ``/kv_policy`` payload; at least
50 requests, none failed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.e2e import record

from vase_sglang.bench import soak

pytestmark = pytest.mark.server

LOCUSTFILE = Path(__file__).resolve().parents[2] / "loadtest" / "locustfile.py"


def test_short_soak_is_flat_and_leak_free(tmp_path: Path) -> None:
    args = soak.parse_args(["--duration", "90", "--warmup", "30", "--sample-every", "3", "--users", "8",
                            "--output-len", "150", "--short-len", "16",
                            "--strict-checks", "--locustfile", str(LOCUSTFILE), "--out", str(tmp_path),
                            "--", "--kv-budget", "96", "--kv-recent", "32", "--max-running-requests", "32"])
    result = soak.run(args)
    v = result["verdict"]
    mix = result["telemetry"]["locust_mix"]
    record("reliability/soak-short", {"seconds": 90, "requests": result["locust"]["requests"],
                                      "failures": result["locust"]["failures"], **v,
                                      "telemetry": mix["all"] if mix else None})
    assert v["rss_growth_mib"] <= soak.MAX_RSS_GROWTH_MIB
    assert v["pass"], json.dumps({**v, "errors": result["locust"]["errors"]}, indent=1)
    # SGLang's leak checks slow the server down; results/reliability/soak-short.json recorded
    # 123 requests in the 90 s (0 failed), so 50 leaves room for a slower machine.
    assert result["locust"]["requests"] >= 50 and result["locust"]["failures"] == 0
    assert set(result["locust"]["by_name"]) >= {"abort", "override", "prefix", "long", "n"}
    assert result["samples"][-1]["rounds"] > 0  # rounds ran throughout
    # The mix's streams reported what eviction cost them, and so did the server's totals: a
    # long output (150 tokens) fills its region of B + R = 128 slots and evicts.
    signal = mix["long"]["evicted_attention"]
    assert signal["n"] > 0 and 0 < signal["p50"] <= signal["p90"] < 1, mix
    assert result["telemetry"]["server_totals"]["vase B=96"]["requests_evicted"] >= signal["n"]
    assert (tmp_path / "soak.png").stat().st_size > 0
    assert "Traceback" not in (tmp_path / "server.log").read_text(errors="replace")
