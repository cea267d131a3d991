"""Every package folder in the checkout is listed in pyproject.toml, so the installed
distribution (which the tests and servers import) has all of it."""

from __future__ import annotations

from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent


def test_all_source_packages_are_shipped() -> None:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    mapping = cfg["package-dir"]
    found = set()
    for name, folder in mapping.items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base)
            found.add(".".join([name, *rel.parts]) if rel.parts else name)
    # Folders mapped on their own (kernels/, patches/) are found through both routes.
    assert found <= listed, f"not shipped: {sorted(found - listed)}"


def test_kernels_and_patches_are_not_top_level_names() -> None:
    import vase_sglang.kernels
    import vase_sglang.patches

    assert vase_sglang.kernels.__name__ == "vase_sglang.kernels"
    assert vase_sglang.patches.__name__ == "vase_sglang.patches"
