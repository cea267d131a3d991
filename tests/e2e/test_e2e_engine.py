"""``sglang.Engine(kv_policy=...)`` and ``sglang.Runtime(kv_policy=...)``: the flags as keyword
arguments of the offline engine and of the frontend runtime."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.constants import PROMPT, REGION
from support.server import cpu_env

pytestmark = pytest.mark.server

# The CPU engine's settings as keyword arguments (server_process.CPU_FLAGS as flags).
CPU_KWARGS = dict(device="cpu", attention_backend="torch_native", disable_cuda_graph=True, mem_fraction_static=0.1,
                  max_total_tokens=16384, dtype="float32", sleep_on_idle=True)

SCRIPT = """
import json, sys
import sglang as sgl

if __name__ == "__main__":
    kwargs = json.loads(sys.argv[2])
    llm = sgl.Engine(model_path=sys.argv[1], **kwargs)
    try:
        out = llm.generate(input_ids=json.loads(sys.argv[3]),
                           sampling_params={"max_new_tokens": 300, "temperature": 0, "ignore_eos": True})
        print("META " + json.dumps(out["meta_info"]))
    finally:
        llm.shutdown()
"""


def _run(tmp_path: Path, text: str, model: Path, kwargs: dict, *extra: str,
         timeout: float = 300) -> subprocess.CompletedProcess:
    """Run a script (model path, kwargs as JSON, extra args) in a fresh interpreter on CPU."""
    script = tmp_path / "run.py"
    script.write_text(text)
    return subprocess.run([sys.executable, str(script), str(model), json.dumps(CPU_KWARGS | kwargs), *extra],
                          env=cpu_env(), capture_output=True, text=True, timeout=timeout, cwd=tmp_path)


def _engine(tmp_path: Path, model: Path, **kwargs) -> subprocess.CompletedProcess:
    return _run(tmp_path, SCRIPT, model, kwargs, json.dumps(PROMPT))


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


RUNTIME_SCRIPT = """
import json, sys
import sglang as sgl

@sgl.function
def continue_text(s, prompt):
    s += prompt
    s += sgl.gen("answer", max_tokens=300, temperature=0, ignore_eos=True)

if __name__ == "__main__":
    kwargs = json.loads(sys.argv[2])
    runtime = sgl.Runtime(model_path=sys.argv[1], **kwargs)
    try:
        sgl.set_default_backend(runtime)
        state = continue_text.run(prompt="The quick brown fox")
        print("META " + json.dumps(state.get_meta_info("answer")))
        print("KVPOLICY " + json.dumps(__import__("requests").get(runtime.url + "/kv_policy").json()))
    finally:
        runtime.shutdown()
"""


def test_frontend_runtime_takes_kv_keyword_arguments(tmp_path: Path, tiny_model: Path) -> None:
    out = _run(tmp_path, RUNTIME_SCRIPT, tiny_model, {"kv_policy": "vase", "kv_budget": 128, "kv_recent": 32})
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    meta = json.loads(next(line for line in lines if line.startswith("META "))[5:])
    assert meta["completion_tokens"] == 300
    assert meta["kv_eviction_rounds"] >= 1 and meta["kv_region_len"] <= REGION
    policy = json.loads(next(line for line in lines if line.startswith("KVPOLICY "))[9:])
    assert policy["config"]["policy"] == "vase" and policy["config"]["budget"] == 128
    assert policy["totals"]["eviction_rounds"] >= 1


def test_frontend_runtime_rejects_a_bad_budget(tmp_path: Path, tiny_model: Path) -> None:
    out = _run(tmp_path, RUNTIME_SCRIPT, tiny_model, {"kv_policy": "vase", "kv_budget": 100, "kv_recent": 64},
               timeout=120)
    assert out.returncode != 0
    assert "invalid --kv-budget 100: must be a multiple of recent=64" in out.stderr
