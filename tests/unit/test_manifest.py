"""The hook manifest and the attribute contract against the pinned SGLang, offline: every
target exists with the parameters the hooks expect, copied logic is pinned by source
hash, every SGLang attribute the plugin touches is defined, and a renamed or changed
target or attribute fails with its name."""

from __future__ import annotations

import dataclasses
import sys
import types
from pathlib import Path

import pytest

from vase_sglang.patches import contract, hooks, manifest


def test_every_target_matches_the_pinned_sglang() -> None:
    import sglang

    assert sglang.__version__ == manifest.SGLANG_VERSION
    assert manifest.check_all() == []


def test_every_manifest_entry_has_its_hook_and_nothing_else_is_hooked() -> None:
    hooks.import_patch_modules()  # every patch module, new ones too: their decorators register
    applied = {t.target for t in manifest.MANIFEST if t.kind != manifest.CALL}
    assert applied - hooks.registered_targets() == set(), "manifest entries without a hook"
    assert hooks.registered_targets() == applied, "hooks on targets the manifest does not list"
    assert len(manifest.BY_TARGET) == len(manifest.MANIFEST), "a target is listed twice"
    for entry in manifest.MANIFEST:
        assert entry.kind in manifest.KINDS and entry.process in ("main", "scheduler") and entry.why, entry
    # Each process applies its own entries in one loop; the other process's stay untouched.
    assert {e.target for e in hooks.entries_for("main")} | {e.target for e in hooks.entries_for("scheduler")} == {
        e.target for e in manifest.MANIFEST if manifest.available(e)}


def test_a_target_gets_one_hook() -> None:
    listed = "sglang.srt.managers.scheduler.Scheduler.init_req_max_new_tokens"
    hooks.import_patch_modules()
    with pytest.raises(ValueError, match="init_req_max_new_tokens has two hooks"):
        hooks.hook(listed, hooks.AROUND)(lambda original, *a, **k: original(*a, **k))


def test_hook_on_an_unlisted_target_is_refused() -> None:
    with pytest.raises(ValueError, match="sglang.srt.nowhere.Thing.method .* not in patches/manifest.py"):
        hooks.hook("sglang.srt.nowhere.Thing.method", hooks.AROUND)
    listed = "sglang.srt.managers.scheduler.Scheduler.init_req_max_new_tokens"
    with pytest.raises(ValueError, match="not in patches/manifest.py with that kind"):
        hooks.hook(listed, hooks.BEFORE)  # listed as AROUND


def _fake_module(monkeypatch: pytest.MonkeyPatch) -> str:
    mod = types.ModuleType("vase_fake_sglang")

    class Scheduler:
        def init_req_max_new_tokens(self, req):
            return req

    mod.Scheduler = Scheduler
    monkeypatch.setitem(__import__("sys").modules, "vase_fake_sglang", mod)
    return "vase_fake_sglang.Scheduler"


def test_a_renamed_target_fails_with_its_name(monkeypatch: pytest.MonkeyPatch) -> None:
    owner = _fake_module(monkeypatch)
    entry = manifest.Target(f"{owner}.init_req_max_new_tokens", manifest.AROUND, "scheduler", "test", ("self", "req"))
    manifest.check(entry)  # holds as written
    renamed = dataclasses.replace(entry, target=f"{owner}.init_request_max_new_tokens")
    with pytest.raises(manifest.ContractError, match=r"^vase_fake_sglang\.Scheduler\.init_request_max_new_tokens: "
                                                     r"cannot be resolved"):
        manifest.check(renamed)
    gone = dataclasses.replace(entry, target="vase_fake_sglang_missing.Scheduler.init_req_max_new_tokens")
    with pytest.raises(manifest.ContractError, match="^vase_fake_sglang_missing"):
        manifest.check(gone)


def test_a_changed_signature_or_source_fails_with_its_name(monkeypatch: pytest.MonkeyPatch) -> None:
    owner = _fake_module(monkeypatch)
    entry = manifest.Target(f"{owner}.init_req_max_new_tokens", manifest.AROUND, "scheduler", "test",
                            ("self", "req", "extra"))
    with pytest.raises(manifest.ContractError, match=r"init_req_max_new_tokens: parameters are \('self', 'req'\)"):
        manifest.check(entry)
    pinned = dataclasses.replace(entry, params=("self", "req"), source_sha256="0" * 64)
    with pytest.raises(manifest.ContractError, match="init_req_max_new_tokens: upstream source changed"):
        manifest.check(pinned)


def test_pinned_sources_are_the_ones_we_reimplement() -> None:
    pinned = [t for t in manifest.MANIFEST if t.source_sha256]
    assert {t.target.rsplit(".", 1)[1] for t in pinned} == {"_create_buffers_normal",
                                                            "_get_running_request_total_token_offset"}


def test_startup_check_stops_the_process_on_a_broken_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    owner = _fake_module(monkeypatch)
    broken = manifest.Target(f"{owner}.gone", manifest.AROUND, "scheduler", "test", ("self",))
    monkeypatch.setitem(manifest.BY_TARGET, broken.target, broken)
    with pytest.raises(SystemExit, match=r"vase_fake_sglang\.Scheduler\.gone: cannot be resolved"):
        hooks.check_contract(broken.target)


# ---- the attribute contract (patches/contract.py) ----------------------------------------
def test_every_attribute_the_plugin_touches_is_defined_by_the_pinned_sglang() -> None:
    assert contract.check_all() == []


def test_every_protocol_is_checked() -> None:
    protocols = {obj for obj in vars(contract).values() if isinstance(obj, type)
                 and getattr(obj, "_is_protocol", False) and obj.__module__ == contract.__name__}
    assert protocols == {p for p, _ in contract.CONTRACTS}
    assert all(contract.members(p) for p in protocols), "a Protocol that declares nothing checks nothing"


def test_a_renamed_attribute_fails_with_its_name(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    mod = types.ModuleType("vase_fake_batch")
    source = (
        "class Base:\n"
        "    def __init__(self):\n"
        "        self.kv_committed_len = 0\n"
        "class Kv(Base):\n"
        "    req_pool_idx: int\n"
        "    def reset(self):\n"
        "        self.kv_allocated_len: int = 0\n"
        "    @property\n"
        "    def cache_protected_len(self):\n"
        "        return 0\n"
        "class Renamed:\n"
        "    def __init__(self):\n"
        "        self.req_pool_idx = self.kv_allocated_len = self.cache_protected_len = 0\n"
        "        self.kv_committed_length = 0\n")
    path = tmp_path / "vase_fake_batch.py"  # inspect.getsource reads the class from its file
    monkeypatch.setitem(sys.modules, "vase_fake_batch", mod)
    path.write_text(source)
    mod.__file__ = str(path)
    exec(compile(source, str(path), "exec"), mod.__dict__)
    assert contract.check(contract.ReqKvInfo, "vase_fake_batch.Kv") == []  # base __init__, annotation, property
    assert contract.check(contract.ReqKvInfo, "vase_fake_batch.Renamed") == [
        "vase_fake_batch.Renamed.kv_committed_len: not defined by SGLang (declared in patches/contract.py ReqKvInfo)"]
    assert contract.check(contract.ReqKvInfo, "vase_fake_batch.Gone")[0].startswith(
        "vase_fake_batch.Gone: cannot be resolved")
