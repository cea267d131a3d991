"""The soak's verdict without a server (``tests/e2e/test_e2e_soak.py`` runs it end to end)."""

from __future__ import annotations

import json

from vase_sglang.bench import soak


def _payload(configs: int, rounds: int) -> dict:
    table = {f"vase B={64 * (i + 1)}": {"requests": 3, "evicted_attention_p50": 0.25} for i in range(configs)}
    return {"policy": "vase", "telemetry": {"enabled": True, "stop_on_loop": False},
            "totals": {"eviction_rounds": rounds, "telemetry": table,
                       "per_rank": [{"eviction_rounds": rounds, "telemetry": {"enabled": True, "by_config": table}}]}}


def test_the_payload_is_measured_without_its_per_config_tables() -> None:
    one, three = soak._without_config_tables(_payload(1, 5)), soak._without_config_tables(_payload(3, 10_000))
    assert one[1] == 1 and three[1] == 3
    assert abs(len(json.dumps(one[0])) - len(json.dumps(three[0]))) <= 8  # only the two counters' digits
    assert three[0]["telemetry"] == {"enabled": True, "stop_on_loop": False}  # the settings stay


def test_a_table_that_grows_with_the_requests_fails_the_verdict() -> None:
    def sample(t: float, nbytes: int, configs: int) -> dict:
        return {"t": t, "rss_mb": 100.0, "used_slots": 0, "kv_policy_bytes": nbytes, "kv_policy_configs": configs}

    totals = {"http_5xx": 0}
    start = sample(31, 500, 1)
    ok = soak.verdict([start], sample(90, 520, 3), totals, warmup=30, max_growth_mib=32, alive=True)
    assert ok["checks"]["kv_policy_payload_bounded"] and ok["pass"]
    grown = soak.verdict([start], sample(90, 520, soak.MAX_FLEET_CONFIGS + 1), totals, 30, 32, True)
    assert not grown["checks"]["kv_policy_payload_bounded"]
    longer = soak.verdict([start], sample(90, 600, 3), totals, 30, 32, True)
    assert not longer["checks"]["kv_policy_payload_bounded"]
