"""PolicyConfig: defaults, derived sizes, and one clear error per invalid value."""

from __future__ import annotations

import json

import pytest

from vase_sglang.config import POLICY_NAMES, PolicyConfig, PolicyConfigError


def test_defaults_follow_the_paper() -> None:
    cfg = PolicyConfig()
    assert (cfg.policy, cfg.budget, cfg.recent, cfg.sinks) == ("vase", 4096, 64, 4)
    assert cfg.large == 1024  # B / 4
    assert (cfg.value_stat, cfg.temperature, cfg.smoothing_kernel, cfg.sketch_rank) == ("range", 1.0, 5, 20)
    assert cfg.region_size == 4160 and cfg.keep_candidates == 4032


def test_outlier_factor_is_off_by_default_and_survives_a_replace() -> None:
    assert PolicyConfig().outlier_factor is None  # the paper's fixed B/4 reservation
    cfg = PolicyConfig(budget=2048, outlier_factor=5.0)
    assert cfg.replace(budget=1024).outlier_factor == 5.0 and cfg.to_dict()["outlier_factor"] == 5.0
    assert PolicyConfig.from_json('{"outlier_factor": 8}').outlier_factor == 8


def test_n_large_follows_budget_unless_given() -> None:
    assert PolicyConfig(budget=2048).large == 512
    assert PolicyConfig(budget=2048, n_large=100).large == 100
    assert PolicyConfig(budget=2048).replace(budget=1024).large == 256
    assert PolicyConfig(budget=2048, n_large=100).replace(budget=1024, n_large=10).large == 10


@pytest.mark.parametrize(
    ("kwargs", "field", "needle"),
    [
        ({"budget": 68}, "budget", ">= 69"),  # below sinks + R + 1
        ({"budget": 100}, "budget", "multiple of recent=64"),
        ({"budget": 128, "n_large": 61}, "n_large", "[0, budget - recent - sinks = 60]"),
        ({"n_large": -1}, "n_large", "[0,"),
        ({"value_stat": "median"}, "value_stat", "range, l2, variance, absmax"),
        ({"policy": "bogus"}, "policy", "none, vase, vase-dkv, snapkv, rkv, curdkv, streamingllm, random"),
        ({"recent": 0}, "recent", ">= 1"),
        ({"sinks": -1}, "sinks", ">= 0"),
        ({"temperature": 0.0}, "temperature", "> 0"),
        ({"temperature": float("nan")}, "temperature", "finite"),
        ({"smoothing_kernel": 4}, "smoothing_kernel", "odd"),
        ({"smoothing_kernel": 0}, "smoothing_kernel", ">= 1"),
        ({"sketch_rank": 0}, "sketch_rank", ">= 1"),
        ({"rkv_lambda": 1.5}, "rkv_lambda", "[0, 1.0]"),
        ({"budget": "4096"}, "budget", "integer"),
        ({"budget": True}, "budget", "integer"),
        ({"outlier_factor": 1.0}, "outlier_factor", "> 1"),
        ({"outlier_factor": -2}, "outlier_factor", "> 0"),
        ({"outlier_factor": float("inf")}, "outlier_factor", "finite"),
        ({"outlier_factor": "5"}, "outlier_factor", "a number"),
    ],
)
def test_invalid_values_name_field_value_and_allowed(kwargs: dict, field: str, needle: str) -> None:
    with pytest.raises(PolicyConfigError) as err:
        PolicyConfig(**kwargs)
    assert err.value.field_name == field
    message = str(err.value)
    assert message.startswith(f"invalid {field}=")
    assert repr(kwargs.get(field, err.value.value)) in message or repr(err.value.value) in message
    assert needle in message


def test_from_dict_rejects_unknown_fields_and_lists_allowed() -> None:
    with pytest.raises(PolicyConfigError) as err:
        PolicyConfig.from_dict({"budgett": 128})
    assert err.value.field_name == "budgett"
    assert "allowed fields: policy, budget, recent" in str(err.value)


def test_from_json_roundtrip_and_bad_json() -> None:
    cfg = PolicyConfig.from_json(json.dumps({"budget": 256, "recent": 32, "value_stat": "l2"}))
    assert (cfg.budget, cfg.recent, cfg.value_stat, cfg.large) == (256, 32, "l2", 64)
    assert PolicyConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(PolicyConfigError, match="valid JSON"):
        PolicyConfig.from_json("{budget: 1")
    with pytest.raises(PolicyConfigError, match="JSON object"):
        PolicyConfig.from_json("[1, 2]")


def test_every_policy_name_is_accepted() -> None:
    for name in POLICY_NAMES:
        assert PolicyConfig(policy=name, budget=128, recent=32).policy == name
    assert not PolicyConfig(policy="none").evicts
