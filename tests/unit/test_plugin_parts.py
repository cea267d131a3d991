"""Which parts of the plugin a process installs (``patches.entry.main_parts``), and that
``--kv-policy none --kv-guards off`` patches nothing in SGLang but the flag parser.

The install runs in a subprocess, one forked child per case after a single import: it
patches SGLang for good, and the test process must stay stock."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from vase_sglang.config import PolicyConfig
from vase_sglang.patches import manifest
from vase_sglang.patches.entry import main_parts
from vase_sglang.plugin.settings import ServerSettings
from vase_sglang.plugin.telemetry import TelemetryOptions

NONE, VASE = PolicyConfig(policy="none"), PolicyConfig(policy="vase")


def _settings(cfg: PolicyConfig, guards: bool) -> ServerSettings:
    return ServerSettings(cfg, None, None, TelemetryOptions(), guards)


@pytest.mark.parametrize(("cfg", "guards", "parts"), [
    (NONE, False, ("flags",)),
    (NONE, True, ("flags", "guards", "eviction")),
    (VASE, False, ("flags", "eviction")),
    (VASE, True, ("flags", "guards", "eviction")),
])
def test_main_parts(cfg: PolicyConfig, guards: bool, parts: tuple[str, ...]) -> None:
    assert main_parts(_settings(cfg, guards)) == parts


def test_every_guard_entry_is_a_main_process_entry_of_patches_guards() -> None:
    guards = [e for e in manifest.MANIFEST if e.part == manifest.GUARDS]
    assert len(guards) == 12 and all(e.process == "main" for e in guards)
    from vase_sglang.patches import hooks

    hooks.import_patch_modules()
    for e in guards:
        if e.kind in manifest.APPLIED:
            assert hooks.registered_function(e.target).__module__.startswith("vase_sglang.patches.guards."), e.target


# Imports what the main process's hooks patch (resolving a target imports its module, and
# patches nothing), then installs the parts of each (policy, guards) in a child forked
# after the imports, as a fresh process would; prints the targets each child patched.
PATCHED = """
import json, os, sys
from vase_sglang.config import PolicyConfig
from vase_sglang.patches import hooks, manifest
from vase_sglang.patches.entry import install_main
from vase_sglang.plugin.settings import ServerSettings
from vase_sglang.plugin.telemetry import TelemetryOptions
from sglang.srt.plugins.hook_registry import HookRegistry

hooks.import_patch_modules()
for entry in manifest.MANIFEST:
    if entry.process == "main" and manifest.available(entry):
        manifest.resolve(entry.target)
assert not HookRegistry._patched
results = []
for case in sys.argv[1:]:
    policy, guards = case.split(":")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        hooks.install("main", ("flags",))  # register(): the flag parser at once
        # once the flags are read
        install_main(ServerSettings(PolicyConfig(policy=policy), None, None, TelemetryOptions(), guards == "on"))
        os.write(write, json.dumps(sorted(HookRegistry._patched)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        patched = f.read()
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0, case
    results.append(json.loads(patched))
print(json.dumps(results))
"""


def _patched(*cases: tuple[str, str]) -> list[set[str]]:
    out = subprocess.run([sys.executable, "-c", PATCHED, *(f"{p}:{g}" for p, g in cases)], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return [set(targets) for targets in json.loads(out.stdout.strip().splitlines()[-1])]


def test_none_with_guards_off_patches_only_the_flag_parser() -> None:
    none_off, none_on, vase_off = _patched(("none", "off"), ("none", "on"), ("vase", "off"))
    flags = {e.target for e in manifest.MANIFEST if e.part == manifest.FLAGS and e.kind in manifest.HOOKED}
    assert none_off == flags
    every_main_hook = {e.target for e in manifest.MANIFEST
                       if e.process == "main" and e.kind in manifest.HOOKED and manifest.available(e)}
    assert none_on == every_main_hook
    guards = {e.target for e in manifest.MANIFEST if e.part == manifest.GUARDS}
    assert vase_off == every_main_hook - guards
