"""Server flags and per-request fields: values, defaults and the wording of errors."""

from __future__ import annotations

import argparse

import pytest

from vase_sglang.config import PolicyConfig, PolicyConfigError
from vase_sglang.plugin.flags import add_cli_flags, config_from_flags, seed_from_flag
from vase_sglang.plugin.options import RequestOptions, request_options
from vase_sglang.plugin.settings import ServerSettings, export_config, imported_settings


def test_flags_parse_and_show_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="launch_server")
    add_cli_flags(parser)
    ns = parser.parse_args(["--kv-policy", "vase", "--kv-budget", "128", "--kv-recent", "32"])
    cfg = config_from_flags(ns.kv_policy, ns.kv_budget, ns.kv_recent, ns.kv_policy_config)
    assert (cfg.policy, cfg.budget, cfg.recent, cfg.large) == ("vase", 128, 32, 32)
    assert ns.kv_seed is None and seed_from_flag(ns.kv_seed) is None  # default: a seed per request
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    out = capsys.readouterr().out
    for flag in ("--kv-policy", "--kv-budget", "--kv-recent", "--kv-seed", "--kv-policy-config", "--kv-telemetry",
                 "--kv-stop-on-loop", "--kv-calibration", "--kv-guards"):
        assert flag in out
    assert parser.parse_args([]).kv_guards == "on"
    with pytest.raises(SystemExit):
        parser.parse_args(["--kv-policy", "bogus"])
    assert "invalid choice: 'bogus'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"policy": "vase", "budget": 100, "recent": 64}, "invalid --kv-budget 100: must be a multiple of recent=64"),
        ({"policy": "vase", "recent": 100}, "invalid --kv-budget 4096: must be a multiple of recent=100"),
        ({"policy": "vase", "policy_config": '{"n_large": 5000}'}, "invalid --kv-policy-config field 'n_large' 5000"),
        ({"policy": "vase", "policy_config": '{"bogus": 1}'}, "--kv-policy-config field 'bogus' 1: unknown field"),
        ({"policy": "vase", "policy_config": "{not json"},
         "invalid --kv-policy-config '{not json': must be valid JSON"),
        ({"policy": "vase", "budget": 256, "policy_config": '{"budget": 128}'}, "given both as --kv-budget"),
        ({"policy": "vase", "policy_config": '{"policy": "rkv"}'}, "set it with --kv-policy"),
        ({"policy": "vase", "policy_config": '{"seed": 3}'}, "set it with --kv-seed"),
        ({"policy": "bogus"}, "invalid --kv-policy 'bogus': must be one of none, vase"),
    ],
)
def test_flag_errors_name_the_flag(kwargs: dict, message: str) -> None:
    with pytest.raises(PolicyConfigError) as err:
        config_from_flags(**kwargs)
    assert message in str(err.value)


def test_export_roundtrip(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VASE_SGLANG_CONFIG", raising=False)
    assert imported_settings().config.policy == "none"
    assert imported_settings().seed is None
    cfg = config_from_flags("vase-dkv", 256, 32, '{"sketch_rank": 8}')
    export_config(cfg, 9)
    assert imported_settings().config == cfg and imported_settings().seed == 9


@pytest.mark.parametrize("bad", [-1, 2**63, "7", True, 1.5])
def test_bad_server_seed(bad: object) -> None:
    with pytest.raises(PolicyConfigError, match="invalid --kv-seed"):
        seed_from_flag(bad)


SERVER = PolicyConfig(policy="vase", budget=256, recent=32)


def validate_request(server: PolicyConfig, custom: dict | None, **settings) -> RequestOptions:
    """A request's options on a server running ``server`` (and ``settings``)."""
    return request_options(ServerSettings(server, **settings), custom)


def test_request_overrides() -> None:
    assert validate_request(SERVER, None).cfg is SERVER
    assert validate_request(SERVER, {"unrelated": 1}).cfg is SERVER
    assert validate_request(SERVER, {"kv_policy": "none"}).cfg.policy == "none"
    small = validate_request(SERVER, {"kv_budget": 128, "kv_seed": 5})
    assert (small.cfg.budget, small.seed, small.cfg.large, small.cfg.recent) == (128, 5, 32, 32)
    # The seed is not part of the config: requests that differ only in it share one policy.
    seeded = validate_request(SERVER, {"kv_seed": 6})
    assert (seeded.cfg, seeded.seed) == (SERVER, 6)
    assert validate_request(SERVER, {"kv_policy": "vase-dkv"}).cfg.policy == "vase-dkv"


@pytest.mark.parametrize(
    ("params", "field", "needle"),
    [
        ({"kv_budget": 512}, "kv_budget", "<= the server's --kv-budget 256"),
        ({"kv_budget": 100}, "kv_budget", "multiple of recent=32"),
        ({"kv_budget": "big"}, "kv_budget", "integer"),
        ({"kv_policy": "bogus"}, "kv_policy", "must be one of"),
        ({"kv_seed": -1}, "kv_seed", "[0, 2**63 - 1]"),
        ({"kv_seed": "x"}, "kv_seed", "integer"),
        ({"kv_budjet": 128}, "kv_budjet", "unknown request field; did you mean 'kv_budget'?"),
        ({"kv_polcy": "vase"}, "kv_polcy", "did you mean 'kv_policy'?"),
        ({"kv_zzz": 1}, "kv_zzz", "fields: kv_policy, kv_budget, kv_n_large, kv_seed"),
        ({"kv_recent": 16}, "kv_recent", "cannot be set per request"),
        ({"kv_n_large": 1000}, "kv_n_large", "budget - recent - sinks"),
    ],
)
def test_bad_request_fields(params: dict, field: str, needle: str) -> None:
    with pytest.raises(PolicyConfigError) as err:
        validate_request(SERVER, params)
    assert err.value.field_name == field
    assert needle in str(err.value) and field in str(err.value)


def test_request_policy_needing_queries_on_a_server_without_them() -> None:
    from vase_sglang.plugin.telemetry import TelemetryOptions

    server = PolicyConfig(policy="vase-dkv", budget=256, recent=32)
    # telemetry on: every evicting server records the window queries
    assert validate_request(server, {"kv_policy": "vase"}).cfg.policy == "vase"
    with pytest.raises(PolicyConfigError, match="needs attention queries"):
        validate_request(server, {"kv_policy": "vase"}, telemetry=TelemetryOptions(enabled=False))
    with pytest.raises(PolicyConfigError, match="--kv-policy none"):
        validate_request(PolicyConfig(policy="none"), {"kv_policy": "vase"})


def test_guards_switch() -> None:
    from vase_sglang.plugin.flags import guards_enabled

    assert guards_enabled(None) and guards_enabled("on") and not guards_enabled("off")
    with pytest.raises(PolicyConfigError, match="invalid --kv-guards 'no': must be one of on, off"):
        guards_enabled("no")  # sglang.Engine(kv_guards="no") reaches this; the CLI's argparse refuses it first
