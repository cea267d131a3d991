"""The kernels on the other Triton the project supports (triton 3.6, what the device tool's H200
image has, as well as the 3.8 that sglang 0.5.23's torch brings).

Installs triton 3.6.0 once into the cache (``pip --target``, from the package registry)
and runs the kernel, round-cost and compile-check tests (the recording of Triton's CUDA
specialization, which gpu_check.sh runs with the GPU machine's Triton) in the interpreter
with it first on the path.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vase_sglang.models import cache_dir

OTHER_TRITON = "3.6.0"
TESTS = Path(__file__).resolve().parent
pytestmark = pytest.mark.slow


def _install(version: str) -> Path:
    target = cache_dir() / f"triton-{version}"
    if not (target / "triton" / "__init__.py").exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                        "--target", str(target), f"triton=={version}"], check=True, timeout=600)
    return target


def test_kernels_pass_on_triton_3_6(tmp_path: Path) -> None:
    target = _install(OTHER_TRITON)
    env = {**os.environ, "PYTHONPATH": str(target), "TRITON_INTERPRET": "1"}
    probe = subprocess.run([sys.executable, "-c", "import triton; print(triton.__version__)"], env=env,
                           capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == OTHER_TRITON
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
                          str(TESTS / "test_kernels.py"), str(TESTS / "test_round_cost.py"),
                          str(TESTS / "test_compile_check.py")],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "failed" not in run.stdout
