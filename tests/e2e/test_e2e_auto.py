"""End-to-end: ``--kv-policy auto --kv-calibration FILE`` on a real CPU server.

Each request runs the policy the calibration recommends for its budget, says which and
why in its meta_info, and a calibration made for another model stops the server at
start-up. (Writing a calibration is ``test_calibrate``'s; the table rule is ``test_auto``'s.)
"""

from __future__ import annotations

import json

import pytest
import requests
from support.e2e import greedy, launch
from support.server import ServerConfig, shared_server

from vase_sglang.plugin.auto import CALIBRATION_KIND, model_fingerprint

pytestmark = pytest.mark.server

R = 32
TABLE = {"64": {"policy": "snapkv", "label": "snapkv"},
         "128": {"policy": "vase", "outlier_factor": 5.0, "label": "vase-outliers"}}


def calibration(path, model, fingerprint: str | None = None):
    config = json.loads((model / "config.json").read_text())
    path.write_text(json.dumps({"kind": CALIBRATION_KIND, "version": 1, "setup": {"recent": R},
                                "model": {"path": str(model), "fingerprint": fingerprint or model_fingerprint(config)},
                                "recommendation": TABLE}))
    return path


@shared_server
def auto_server(tiny_model, server_dir) -> ServerConfig:
    cal = calibration(server_dir / "auto-calibration.json", tiny_model)
    return ServerConfig("auto", ("--kv-policy", "auto", "--kv-calibration", str(cal), "--kv-budget", "128"))


def test_each_request_runs_the_recommendation_for_its_budget_and_says_why(auto_server) -> None:
    default = greedy(auto_server, 300)["meta_info"]  # the server's budget, 128
    assert default["kv_policy"] == "vase"
    assert "recommends vase-outliers at B=128" in default["kv_policy_reason"]
    assert default["kv_eviction_rounds"] >= 1 and default["kv_region_len"] <= 128 + R

    small = greedy(auto_server, 300, custom_params={"kv_budget": 96})["meta_info"]
    assert small["kv_policy"] == "snapkv"  # 96: the largest calibrated budget <= 96 is 64
    assert "recommends snapkv at B=64 (nearest calibrated budget <= 96)" in small["kv_policy_reason"]
    assert small["kv_eviction_rounds"] > default["kv_eviction_rounds"] and small["kv_region_len"] <= 96 + R

    asked = greedy(auto_server, 50, custom_params={"kv_policy": "auto", "kv_budget": 64})["meta_info"]
    assert asked["kv_policy"] == "snapkv" and "B=64" in asked["kv_policy_reason"]
    chosen = greedy(auto_server, 50, custom_params={"kv_policy": "streamingllm"})["meta_info"]
    assert (chosen["kv_policy"], chosen["kv_policy_reason"]) == ("streamingllm", "request kv_policy")


def test_kv_policy_endpoint_shows_the_table(auto_server) -> None:
    body = requests.get(auto_server.url + "/kv_policy", timeout=30).json()
    assert body["policy"] == "auto" and body["config"]["policy"] == "vase"
    assert body["auto"]["table"]["by_budget"] == TABLE
    assert "at B=128" in body["auto"]["at_server_budget"]


def test_a_calibration_of_another_model_stops_the_server_at_start_up(tiny_model, tmp_path) -> None:
    cal = calibration(tmp_path / "other.json", tiny_model, fingerprint="0123456789abcdef")
    out = launch("--model-path", str(tiny_model), "--device", "cpu", "--kv-policy", "auto",
                 "--kv-calibration", str(cal))
    assert out.returncode != 0
    assert "it was measured on another model" in out.stderr and "calibrate this model first" in out.stderr
