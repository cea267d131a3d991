"""CPU mode: the sgl_kernel stand-in appears only when the real module cannot load.

Each case runs a fresh interpreter, so the installed ``vase_sglang_cpu_mode.pth`` does
the work exactly as it does for SGLang's processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = (
    "import sgl_kernel, vase_sglang.plugin.cpu_mode as c; "
    "print('stand-in' if c.is_stand_in(sgl_kernel) else 'real:' + getattr(sgl_kernel, 'WHO', '?'))"
)


def _fake_sgl_kernel(root: Path, body: str) -> Path:
    pkg = root / "sgl_kernel"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(body)
    return root


def _run(pythonpath: Path | None, cpu_engine: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SGLANG_USE_CPU_ENGINE")}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    if cpu_engine:
        env["SGLANG_USE_CPU_ENGINE"] = "1"
    return subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120, cwd="/")


def test_stand_in_replaces_a_real_module_that_cannot_load(tmp_path: Path) -> None:
    root = _fake_sgl_kernel(tmp_path, "raise ImportError('libcuda.so.1: cannot open shared object file')\n")
    out = _run(root, cpu_engine=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "stand-in"
    assert "using a stand-in sgl_kernel (libcuda.so.1" in out.stderr


def test_real_module_is_never_shadowed(tmp_path: Path) -> None:
    root = _fake_sgl_kernel(tmp_path, "WHO = 'gpu-build'\n")
    out = _run(root, cpu_engine=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "real:gpu-build"


def test_nothing_happens_without_the_cpu_engine(tmp_path: Path) -> None:
    root = _fake_sgl_kernel(tmp_path, "raise ImportError('libcuda.so.1: cannot open shared object file')\n")
    out = _run(root, cpu_engine=False)
    assert out.returncode != 0
    assert "libcuda.so.1" in out.stderr


def test_stand_in_names_what_sglang_imports_and_fails_loudly_if_called() -> None:
    from vase_sglang.plugin.cpu_mode import STUB_NAMES, make_stub

    stub = make_stub()
    assert "assign_req_to_token_pool_cpu" in STUB_NAMES
    for name in STUB_NAMES:
        with pytest.raises(NotImplementedError, match=f"sgl_kernel.{name} is not available"):
            getattr(stub, name)()
