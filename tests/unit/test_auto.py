"""``--kv-policy auto``: the budget -> policy rule, the calibration file's checks, and the
request validation and memory sizing that follow from a table (no server; see
``test_e2e_auto`` for one)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vase_sglang.config import PolicyConfig, PolicyConfigError
from vase_sglang.plugin.auto import (
    BUILTIN,
    BUILTIN_POLICY,
    CALIBRATION_KIND,
    AutoTable,
    load_calibration,
    model_fingerprint,
)
from vase_sglang.plugin.flags import server_config
from vase_sglang.plugin.options import carried_options, carry, request_options
from vase_sglang.plugin.planning import captures_queries, reachable_configs, round_workspace_bytes, warmup_configs
from vase_sglang.plugin.settings import ServerSettings, export_config, imported_settings
from vase_sglang.policies import RoundShape, make_policy

CONFIG = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 100}
TABLE = {"64": {"policy": "streamingllm", "label": "streamingllm"},
         "128": {"policy": "vase", "outlier_factor": 5.0, "label": "vase-outliers"},
         "256": {"policy": "snapkv", "label": "snapkv"}}


def write_calibration(tmp_path: Path, recommendation: dict | None = None, config: dict | None = None,
                      recent: int = 32) -> Path:
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({"kind": CALIBRATION_KIND, "version": 1, "setup": {"recent": recent},
                                "model": {"path": "m", "fingerprint": model_fingerprint(config or CONFIG)},
                                "recommendation": TABLE if recommendation is None else recommendation}))
    return path


def model_dir(tmp_path: Path, config: dict) -> str:
    d = tmp_path / "model"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    return str(d)


def test_a_budget_runs_the_recommendation_of_the_largest_calibrated_budget_at_or_below_it(tmp_path) -> None:
    table = load_calibration(str(write_calibration(tmp_path)), model_fingerprint(CONFIG))
    assert table.choose(64).changes == {"policy": "streamingllm", "outlier_factor": None}
    assert table.choose(127).policy == "streamingllm"  # between 64 and 128: 64's choice
    assert table.choose(128).changes == {"policy": "vase", "outlier_factor": 5.0}
    assert table.choose(4096).policy == "snapkv"
    below = table.choose(32)  # below every calibrated budget: the smallest's
    assert below.policy == "streamingllm" and "smallest calibrated budget; 32 is below it" in below.reason
    assert "recommends vase-outliers at B=128 (nearest calibrated budget <= 200)" in table.choose(200).reason
    assert BUILTIN.choose(64).policy == BUILTIN_POLICY and "built-in" in BUILTIN.choose(64).reason


@pytest.mark.parametrize(("content", "needle"), [
    ("{", "not JSON"),
    ('{"kind": "other"}', "not a calibration file"),
    (json.dumps({"kind": CALIBRATION_KIND, "version": 9}), "calibration version 9"),
    (json.dumps({"kind": CALIBRATION_KIND, "version": 1, "recommendation": {}}), "recommends nothing"),
    (json.dumps({"kind": CALIBRATION_KIND, "version": 1, "recommendation": {"64": {"policy": "bogus"}}}),
     "is not an evicting policy"),
])
def test_a_bad_calibration_file_is_refused_in_one_line(tmp_path, content: str, needle: str) -> None:
    path = tmp_path / "c.json"
    path.write_text(content)
    with pytest.raises(PolicyConfigError, match=needle) as info:
        load_calibration(str(path))
    assert str(info.value).startswith(f"invalid --kv-calibration '{path}'") and "\n" not in str(info.value)
    with pytest.raises(PolicyConfigError, match="cannot read it"):
        load_calibration(str(tmp_path / "missing.json"))


def _server(policy: str, budget: int | None, recent: int | None, calibration: str | None = None,
            model: str | None = None) -> ServerSettings:
    """The config and table of a server's flags (the telemetry's use of the file is
    ``telemetry_options``'s, tested in test_telemetry.py)."""
    flags = {"kv_policy": policy, "kv_budget": budget, "kv_recent": recent, "kv_calibration": calibration}
    cfg, auto = server_config(flags, model)
    return ServerSettings(cfg, auto=auto)


def test_a_calibration_of_another_model_is_refused_at_start_up(tmp_path) -> None:
    path = str(write_calibration(tmp_path))
    other = model_dir(tmp_path, {**CONFIG, "num_hidden_layers": 3})
    with pytest.raises(PolicyConfigError, match="measured on another model"):
        _server("auto", 256, None, path, other)
    settings = _server("auto", 256, None, path, model_dir(tmp_path, CONFIG))
    cfg, auto = settings.config, settings.auto
    assert (cfg.policy, cfg.budget, cfg.recent, settings.seed) == ("snapkv", 256, 32, None)  # R from the calibration
    assert auto is not None and auto.by_budget.keys() == {64, 128, 256}
    with pytest.raises(PolicyConfigError, match="measured with recent 32; start with --kv-recent 32"):
        _server("auto", 256, 64, path, model_dir(tmp_path, CONFIG))
    # Another evicting policy reads the file for its KL mappings: checked the same way.
    (tmp_path / "other").mkdir()
    with pytest.raises(PolicyConfigError, match="measured on another model"):
        _server("vase", 256, None, path, model_dir(tmp_path / "other", {**CONFIG, "vocab_size": 7}))
    settings = _server("vase", 256, None, path, model_dir(tmp_path, CONFIG))
    assert (settings.config.policy, settings.config.recent, settings.auto) == ("vase", 32, None)
    with pytest.raises(PolicyConfigError, match="start with an evicting --kv-policy"):
        _server("none", None, None, path, model_dir(tmp_path, CONFIG))


def test_auto_without_a_file_serves_the_builtin_choice() -> None:
    settings = _server("auto", 128, 32)
    assert settings.config.policy == BUILTIN_POLICY and settings.auto is BUILTIN


def test_requests_on_an_auto_server_follow_their_budget_and_say_why(tmp_path) -> None:
    table = load_calibration(str(write_calibration(tmp_path)))
    server = PolicyConfig(policy="snapkv", budget=256, recent=32)
    settings = ServerSettings(server, auto=table)
    options = request_options(settings, None)
    assert options.cfg.policy == "snapkv" and "at B=256" in options.reason
    options = request_options(settings, {"kv_budget": 128})
    assert (options.cfg.policy, options.cfg.budget, options.cfg.outlier_factor) == ("vase", 128, 5.0)
    assert "vase-outliers at B=128" in options.reason
    options = request_options(settings, {"kv_budget": 96, "kv_policy": "auto"})
    assert (options.cfg.policy, options.cfg.budget) == ("streamingllm", 96) and "B=64" in options.reason
    options = request_options(settings, {"kv_budget": 128, "kv_policy": "random"})
    assert (options.cfg.policy, options.cfg.outlier_factor, options.reason) == ("random", None, "request kv_policy")
    # The scheduler reads the options the tokenizer process carried, reason included.
    custom: dict = {"kv_budget": 128}
    carry(custom, request_options(settings, custom))
    options = carried_options(settings, custom, rid="r")
    assert options.cfg.policy == "vase" and "vase-outliers" in options.reason
    assert "at B=256" in carried_options(settings, None, rid="r").reason


def test_kv_policy_auto_on_a_server_of_one_policy_runs_the_builtin_choice() -> None:
    server = PolicyConfig(policy="snapkv", budget=256, recent=32)
    options = request_options(ServerSettings(server), {"kv_policy": "auto"})
    assert options.cfg.policy == BUILTIN_POLICY and "built-in" in options.reason
    with pytest.raises(PolicyConfigError, match="--kv-policy none"):
        request_options(ServerSettings(PolicyConfig(policy="none")), {"kv_policy": "auto"})


def test_a_table_that_may_choose_a_query_policy_makes_the_server_capture_queries_and_size_for_it() -> None:
    server = PolicyConfig(policy="streamingllm", budget=128, recent=32)
    table = AutoTable({64: {"policy": "streamingllm"}, 128: {"policy": "vase", "outlier_factor": 5.0}}, "t.json")
    assert not captures_queries(server) and captures_queries(server, table)
    shape = RoundShape(n_req=8, n_layers=2, q_heads=4, kv_heads=2, head_dim=16, itemsize=4, total_kv_heads=2)
    assert round_workspace_bytes(server, shape, table) > round_workspace_bytes(server, shape)
    # The outlier reservation (its median maps) is among the configs the reserve covers.
    outliers = server.replace(policy="vase", outlier_factor=5.0)
    assert outliers in reachable_configs(server, table) and outliers not in reachable_configs(server)
    assert round_workspace_bytes(server, shape, table) >= make_policy(outliers).workspace_bytes(shape)
    assert make_policy(outliers).workspace_bytes(shape) > make_policy(outliers.replace(outlier_factor=None)
                                                                      ).workspace_bytes(shape)
    assert any(c.outlier_factor == 5.0 for c in warmup_configs(server, table))


def test_the_table_travels_to_every_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VASE_SGLANG_CONFIG", raising=False)
    table = AutoTable({64: {"policy": "snapkv", "label": "snapkv"}}, "c.json", 32, "abc")
    export_config(PolicyConfig(policy="snapkv", budget=64, recent=32), None, table)
    assert imported_settings().auto == table
    export_config(PolicyConfig(policy="vase", budget=64, recent=32))
    assert imported_settings().auto is None


def test_a_table_that_may_choose_a_stateful_policy_makes_the_server_keep_score_state() -> None:
    from vase_sglang.plugin.planning import keeps_state, score_state_bytes_per_request

    server = PolicyConfig(policy="streamingllm", budget=128, recent=32)
    table = AutoTable({64: {"policy": "gkv"}, 128: {"policy": "h2o"}}, "t.json")
    assert not keeps_state(server) and keeps_state(server, table)
    assert score_state_bytes_per_request(server, 2, 2, table) == 4 * 2 * 2 * server.region_size
    assert table.choose(100).policy == "gkv" and table.choose(128).policy == "h2o"
    assert {"gkv", "h2o"} <= {c.policy for c in warmup_configs(server, table)}
