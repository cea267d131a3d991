"""Every package folder in the checkout is listed in pyproject.toml, so the installed
distribution (which the tests and servers import) has all of it; and the checkout root
imports as it is laid out, without shadowing SGLang's own ``kernels`` import."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]


def test_all_source_packages_are_shipped() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    # The packages holding a module; kernels/ and patches/ are reached through their links.
    found = {name if path.name == "__init__.py" else name.rpartition(".")[0] for name, path in _modules().items()}
    assert found <= listed, f"not shipped: {sorted(found - listed)}"
    assert (ROOT / "vase_sglang" / "kernels").resolve() == ROOT / "kernels"
    assert (ROOT / "vase_sglang" / "patches").resolve() == ROOT / "patches"


def _from_root(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_the_checkout_root_imports_its_own_tree() -> None:
    # The installed package's .pth hooks import vase_sglang at interpreter start-up: drop it,
    # then import the checkout's copy as laid out (kernels/ and patches/ through their links).
    where = _from_root("import sys; "
                       "[sys.modules.pop(m) for m in list(sys.modules) if m.split('.')[0] == 'vase_sglang']; "
                       "sys.path.insert(0, ''); "
                       "import vase_sglang.kernels.ops as o, vase_sglang.patches.manifest as m; "
                       "print(o.__file__); print(m.__file__)").splitlines()
    assert where == [str(ROOT / "vase_sglang" / "kernels" / "ops.py"),
                     str(ROOT / "vase_sglang" / "patches" / "manifest.py")]


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


# The two parts of the package (vase_sglang/__init__.py): what runs inside SGLang, and the
# tools beside it. The algorithm and the kernels must run without SGLang (the fidelity
# harness and the kernel tests use them alone).
TOOLS = {"bench", "calibrate", "eval", "fidelity", "models", "bundled", "cluster", "server_process", "cli"}
ALGORITHM = {"registry", "config", "policies", "sharding", "kernels", "telemetry"}


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (kernels/ and patches/ through their links)."""
    out = {}
    for folder, _, files in os.walk(ROOT / "vase_sglang", followlinks=True):  # rglob skips links
        for file in files:
            if file.endswith(".py"):
                parts = (Path(folder) / file).relative_to(ROOT).with_suffix("").parts
                out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = Path(folder) / file
    return out


def _imports(name: str, path: Path) -> set[str]:
    """The absolute names a module imports, relative imports resolved."""
    import ast

    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _part(name: str) -> str:
    top = name.split(".")[1] if name.count(".") else ""
    return "tool" if top in TOOLS else "algorithm" if top in ALGORITHM else "plugin"


def test_what_runs_inside_sglang_imports_no_tool_and_the_algorithm_no_sglang() -> None:
    modules = _modules()
    assert {_part(n) for n in modules} == {"tool", "algorithm", "plugin"}
    assert {"vase_sglang.kernels.ops", "vase_sglang.patches.hooks"} <= set(modules)
    crossings = []
    for name, path in modules.items():
        for imported in _imports(name, path):
            if _part(name) != "tool" and imported.startswith("vase_sglang.") and _part(imported) == "tool":
                crossings.append(f"{name} imports the tool {imported}")
            if _part(name) == "algorithm" and imported.split(".")[0] in ("sglang", "sgl_kernel"):
                crossings.append(f"{name} imports {imported}")
    assert not crossings, "\n".join(crossings)


def test_the_sglang_pin_is_the_manifests() -> None:
    """One SGLang version: pyproject's dependency pin is ``manifest.SGLANG_VERSION``, the
    version the manifest's targets, the GPU kit (scripts/gpu_e2e/pack.py) and the tests use."""
    from vase_sglang.patches.manifest import SGLANG_VERSION

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert [d for d in deps if d.startswith("sglang")] == [f"sglang=={SGLANG_VERSION}"]
