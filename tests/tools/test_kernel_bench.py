"""The kernel benchmark's per-policy round rows, at toy shapes on the torch path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vase_sglang.bench import kernels


def test_every_listed_policy_gets_a_whole_round_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the torch path only: quick
    out = tmp_path / "rows.json"
    assert kernels.main(["--requests", "1", "--budgets", "64", "--recent", "16", "--layers", "1", "--q-heads", "4",
                         "--kv-heads", "2", "--head-dim", "16", "--repeat", "1",
                         "--policies", "snapkv,h2o,gkv,tova", "--json", str(out)]) == 0
    rows = {r["op"]: r for r in json.loads(out.read_text())}
    for name in ("vase_round", "snapkv_round", "h2o_round", "gkv_round", "tova_round"):
        assert rows[name]["torch_ms"] > 0 and rows[name]["triton_ms"] is None


def test_an_unknown_policy_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        kernels.parse_args(["--policies", "h2o,none"])
    assert "unknown evicting policy 'none'" in capsys.readouterr().err
