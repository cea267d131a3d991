"""The start-up check refuses models the eviction path cannot serve, naming what it found."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vase_sglang.config import PolicyConfig
from vase_sglang.patches import memory
from vase_sglang.plugin.settings import export_config


def _runner(attention_arch, **hf) -> SimpleNamespace:
    config = SimpleNamespace(attention_arch=attention_arch, model_path="some/model",
                             hf_text_config=SimpleNamespace(**hf))
    return SimpleNamespace(model_config=config)


@pytest.fixture(autouse=True)
def _vase(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VASE_SGLANG_CONFIG", "")
    export_config(PolicyConfig(policy="vase", budget=128, recent=32))


def test_an_mla_model_is_refused_by_name() -> None:
    from sglang.srt.configs.model_config import AttentionArch

    with pytest.raises(SystemExit, match="cannot serve some/model: MLA attention"):
        memory._check_model(_runner(AttentionArch.MLA), "vase")


def test_an_mha_model_passes() -> None:
    from sglang.srt.configs.model_config import AttentionArch

    memory._check_model(_runner(AttentionArch.MHA), "vase")


def test_sliding_window_and_alibi_are_refused_together() -> None:
    from sglang.srt.configs.model_config import AttentionArch

    with pytest.raises(SystemExit, match="sliding-window attention \\(window 64\\), ALiBi positions"):
        memory._check_model(_runner(AttentionArch.MHA, sliding_window=64, alibi=True), "vase")
