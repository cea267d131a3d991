"""The kernels on the other Triton the project supports (triton 3.6, what the device tool's H200
image has, as well as the 3.8 that sglang 0.5.23's torch brings).

Installs triton 3.6.0 once into the cache (``pip --target``, from the package registry)
and runs the kernel, round-cost and compile-check tests (the recording of Triton's CUDA
specialization, which gpu_check.sh runs with the GPU machine's Triton) in the interpreter
with it first on the path, in the background of the run (``support.background``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from support.background import Finished, Job, background_job

from vase_sglang.models import cache_dir

OTHER_TRITON = "3.6.0"
TESTS = Path(__file__).resolve().parent
pytestmark = pytest.mark.slow


# Installs triton (pip --target, once into the cache), prints the version that imports with it
# first on the path, then runs the given test files there.
SCRIPT = """
import os, subprocess, sys
version, target, *tests = sys.argv[1:]
if not os.path.exists(os.path.join(target, "triton", "__init__.py")):
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                    "--target", target, "triton==" + version], check=True, timeout=600)
env = {**os.environ, "PYTHONPATH": target, "TRITON_INTERPRET": "1"}
probe = subprocess.run([sys.executable, "-c", "import triton; print(triton.__version__)"], env=env,
                       capture_output=True, text=True, check=True)
print("TRITON", probe.stdout.strip(), flush=True)
sys.exit(subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *tests], env=env))
"""


@background_job
def kernel_tests_on_triton_3_6(folder: Path) -> Job:
    """The kernel, round-cost and compile-check tests with triton 3.6 first on the path."""
    return Job([sys.executable, "-c", SCRIPT, OTHER_TRITON, str(cache_dir() / f"triton-{OTHER_TRITON}"),
                *(str(TESTS / name) for name in ("test_kernels.py", "test_round_cost.py", "test_compile_check.py"))],
               env={**os.environ}, timeout=1800, expected_s=220)


def test_kernels_pass_on_triton_3_6(kernel_tests_on_triton_3_6: Finished) -> None:
    run = kernel_tests_on_triton_3_6
    assert run.stdout.startswith(f"TRITON {OTHER_TRITON}\n"), run.stdout[:200] + run.stderr[-2000:]
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "failed" not in run.stdout
