"""The package as shipped, read from the checkout: each package's folder (pyproject's
``packages`` and ``package-dir``), its modules and what each imports."""

from __future__ import annotations

import ast
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]


def package_dirs() -> dict[str, Path]:
    """Each shipped package's folder in the checkout, from pyproject's package-dir."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapped = setuptools.get("package-dir", {})
    return {name: ROOT / mapped.get(name, name.replace(".", "/")) for name in setuptools["packages"]}


def modules() -> dict[str, Path]:
    """Every module of the shipped packages by dotted name."""
    out = {}
    for package, folder in package_dirs().items():
        for path in folder.glob("*.py"):
            out[package if path.name == "__init__.py" else f"{package}.{path.stem}"] = path
    return out


def imports(name: str, path: Path) -> set[str]:
    """What module ``name`` imports, anywhere in its body (lazy imports too), relative
    imports resolved: each ``import a.b``, and for ``from a import b`` both ``a`` and
    ``a.b`` (``b`` may be a module or a name in ``a``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            names = [f"{base}.{alias.name}" for alias in node.names] + [base]
        found.update(names)
    return found
