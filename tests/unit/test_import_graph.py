"""Imports go one way, and the tree is what a reader sees.

Inside SGLang the package has four layers: the hooks (``patches/``, shipped as
``vase_sglang.patches``) over the adapter (``vase_sglang.plugin``) over the algorithm and
the kernels. A module may import its own layer and the layers below it, never one above,
and no import cycle may join modules (lazy imports inside functions count: they close a
cycle as surely at run time). The tools beside the server (``TOOLS``) may import any
layer; nothing inside SGLang imports a tool. The tree has no symbolic links: a reader, an
editor and every tool see each file where it is.
"""

from __future__ import annotations

import os
import subprocess

import pytest
from support.package_tree import ROOT, imports, modules

# Layer of each top-level part of the package, lowest first: a module may import modules
# of its own layer and the layers before it.
LAYERS = ("algorithm", "plugin", "patches")
ALGORITHM = {"config", "policies", "registry", "sharding", "telemetry", "kernels", "__init__"}
TOOLS = {"bench", "calibrate", "eval", "fidelity", "models", "bundled", "cluster", "server_process", "cli",
         "compile_check"}


def layer(name: str) -> str:
    parts = name.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    if top in TOOLS:
        return "tool"
    if top in ALGORITHM:
        return "algorithm"
    return top  # plugin, patches


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    problems = []
    for name, targets in graph.items():
        for target in targets:
            lo, hi = layer(name), layer(target)
            if hi == "tool" and lo != "tool":
                problems.append(f"{name} ({lo}) imports the tool {target}")
            elif lo != "tool" and LAYERS.index(hi) > LAYERS.index(lo):
                problems.append(f"{name} ({lo}) imports {target} ({hi}), a layer above it")
    return sorted(problems)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: {m for m in imports(name, path) if m in known} - {name} for name, path in known.items()}


def test_the_package_has_its_four_layers() -> None:
    layers = {layer(n) for n in modules()}
    assert layers == {"tool", "algorithm", "plugin", "patches"}, layers
    assert {"vase_sglang.kernels.ops", "vase_sglang.patches.hooks", "vase_sglang.plugin.scheduler"} <= set(modules())


def test_no_module_imports_a_layer_above_its_own() -> None:
    problems = upward_imports(graph())
    assert not problems, "\n".join(problems)


def test_no_import_cycle_joins_modules() -> None:
    found = cycles(graph())
    assert not found, "\n".join(" <-> ".join(c) for c in found)


def test_the_checks_catch_an_upward_import_and_a_cycle() -> None:
    planted = {"vase_sglang.plugin.scheduler": {"vase_sglang.patches.runtime"},
               "vase_sglang.patches.runtime": {"vase_sglang.plugin.scheduler"},
               "vase_sglang.policies": {"vase_sglang.bench.serving"}}
    assert upward_imports(planted) == [
        "vase_sglang.plugin.scheduler (plugin) imports vase_sglang.patches.runtime (patches), a layer above it",
        "vase_sglang.policies (algorithm) imports the tool vase_sglang.bench.serving"]
    assert cycles(planted) == [["vase_sglang.patches.runtime", "vase_sglang.plugin.scheduler"]]


def _tracked_and_untracked() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                             capture_output=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        pytest.skip("not a git checkout")
    return [p for p in out.decode().split("\0") if p]


def test_the_tree_has_no_symbolic_links() -> None:
    links = [p for p in _tracked_and_untracked() if os.path.islink(ROOT / p)]
    assert not links, f"symbolic links in the tree: {links}"
