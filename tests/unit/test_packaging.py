"""Every package folder in the checkout is listed in pyproject.toml, so the installed
distribution (which the tests and servers import) has all of it, laid out as in the
checkout; and the checkout root does not shadow SGLang's own ``kernels`` import."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from support.package_tree import ROOT, imports, modules, package_dirs


def test_all_source_packages_are_shipped() -> None:
    dirs = package_dirs()
    shipped = {folder.resolve() for folder in dirs.values()}
    # Every folder of the checkout that holds a module of the package is a shipped package.
    sources = {p.parent.resolve() for top in ("vase_sglang", "kernels", "patches") for p in (ROOT / top).rglob("*.py")
               if "__pycache__" not in p.parts}
    assert sources <= shipped, f"not shipped: {sorted(str(s.relative_to(ROOT)) for s in sources - shipped)}"
    assert dirs["vase_sglang.kernels"] == ROOT / "kernels" and dirs["vase_sglang.patches"] == ROOT / "patches"


def test_the_installed_package_is_the_checkout_as_laid_out() -> None:
    """Each module the checkout ships is installed under its dotted name, with the same text."""
    for name, path in modules().items():
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None, name
        assert Path(spec.origin).read_text() == path.read_text(), f"{name}: the installed copy differs; reinstall"


def _from_root(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


@pytest.mark.skipif(importlib.util.find_spec("kernels") is None, reason="the kernels package is not installed")
def test_the_root_kernels_folder_does_not_shadow_the_kernels_package() -> None:
    installed = importlib.util.find_spec("kernels")
    assert installed is not None and installed.origin is not None
    assert _from_root("import kernels; print(kernels.__file__)") == installed.origin


def test_kernels_and_patches_are_not_top_level_names() -> None:
    import vase_sglang.kernels
    import vase_sglang.patches

    assert vase_sglang.kernels.__name__ == "vase_sglang.kernels"
    assert vase_sglang.patches.__name__ == "vase_sglang.patches"


# The algorithm and the kernels must run without SGLang (the fidelity harness and the
# kernel tests use them alone). Which layer may import which: tests/unit/test_import_graph.py.
ALGORITHM = {"registry", "config", "policies", "sharding", "kernels", "telemetry"}


def test_the_algorithm_imports_no_sglang() -> None:
    crossings = []
    for name, path in modules().items():
        top = name.split(".")[1] if name.count(".") else ""
        if top not in ALGORITHM:
            continue
        crossings += [f"{name} imports {i}" for i in imports(name, path) if i.split(".")[0] in ("sglang", "sgl_kernel")]
    assert {"vase_sglang.kernels.ops", "vase_sglang.policies"} <= set(modules())
    assert not crossings, "\n".join(crossings)


def test_the_sglang_pin_is_the_manifests() -> None:
    """One SGLang version: pyproject's dependency pin is ``manifest.SGLANG_VERSION``, the
    version the manifest's targets, the GPU kit (scripts/gpu_e2e/pack.py) and the tests use."""
    from vase_sglang.patches.manifest import SGLANG_VERSION

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert [d for d in deps if d.startswith("sglang")] == [f"sglang=={SGLANG_VERSION}"]
