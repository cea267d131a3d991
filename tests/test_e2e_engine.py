"""``sglang.Engine(kv_policy=...)``: the flags as keyword arguments of the offline engine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from e2e_helpers import PROMPT, REGION
from server import cpu_env

pytestmark = pytest.mark.e2e

SCRIPT = """
import json, sys
import sglang as sgl

if __name__ == "__main__":
    kwargs = json.loads(sys.argv[2])
    llm = sgl.Engine(model_path=sys.argv[1], device="cpu", attention_backend="torch_native",
                     disable_cuda_graph=True, mem_fraction_static=0.1, max_total_tokens=16384,
                     dtype="float32", sleep_on_idle=True, **kwargs)
    try:
        out = llm.generate(input_ids=json.loads(sys.argv[3]),
                           sampling_params={"max_new_tokens": 300, "temperature": 0, "ignore_eos": True})
        print("META " + json.dumps(out["meta_info"]))
    finally:
        llm.shutdown()
"""


def _engine(tmp_path: Path, model: Path, **kwargs) -> subprocess.CompletedProcess:
    script = tmp_path / "engine_run.py"
    script.write_text(SCRIPT)
    return subprocess.run([sys.executable, str(script), str(model), json.dumps(kwargs), json.dumps(PROMPT)],
                          env=cpu_env(), capture_output=True, text=True, timeout=300, cwd=tmp_path)


def test_engine_takes_kv_keyword_arguments(tmp_path: Path, tiny_model: Path) -> None:
    out = _engine(tmp_path, tiny_model, kv_policy="vase", kv_budget=128, kv_recent=32, kv_seed=7)
    assert out.returncode == 0, out.stderr[-3000:]
    meta = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("META "))[5:])
    assert meta["completion_tokens"] == 300
    assert meta["kv_eviction_rounds"] >= 1 and meta["kv_region_len"] <= REGION


def test_engine_rejects_a_bad_budget(tmp_path: Path, tiny_model: Path) -> None:
    out = _engine(tmp_path, tiny_model, kv_policy="vase", kv_budget=100, kv_recent=64)
    assert out.returncode != 0
    assert "invalid --kv-budget 100: must be a multiple of recent=64" in out.stderr
