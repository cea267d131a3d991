"""The hook manifest against the pinned SGLang, offline: every target exists with the
parameters the hooks expect, copied logic is pinned by source hash, and a renamed or
changed target fails with its name."""

from __future__ import annotations

import dataclasses
import importlib
import types

import pytest

from vase_sglang.patches import hooks, manifest
from vase_sglang.patches.decode import BACKEND_CLASSES


def test_every_target_matches_the_pinned_sglang() -> None:
    import sglang

    assert sglang.__version__ == manifest.SGLANG_VERSION
    assert manifest.check_all() == []


def test_manifest_lists_exactly_what_the_patches_touch() -> None:
    import pkgutil

    import vase_sglang.patches

    for info in pkgutil.iter_modules(vase_sglang.patches.__path__):  # every patch module, new ones too
        importlib.import_module(f"vase_sglang.patches.{info.name}")  # importing queues the hooks
    backends = {f"{cls}.{m}" for cls in BACKEND_CLASSES.values() for m in ("forward_decode", "forward_extend")}
    hooked = {h.target for h in hooks.take()} | backends
    set_or_called = {t.target for t in manifest.MANIFEST if t.kind in (manifest.SET, manifest.CALL)}
    assert hooked | set_or_called == set(manifest.BY_TARGET), "stale or missing manifest entries"
    assert len(manifest.BY_TARGET) == len(manifest.MANIFEST), "a target is listed twice"
    for entry in manifest.MANIFEST:
        assert entry.kind in manifest.KINDS and entry.process in ("main", "scheduler") and entry.why, entry


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
