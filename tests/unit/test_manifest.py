"""The hook manifest and the attribute contract against the pinned SGLang, offline: every
target exists with the parameters the hooks expect, copied or mirrored logic is pinned by
source hash, every SGLang attribute the plugin touches is defined, the process roles are
SGLang's functions that call load_plugins(), and a renamed or changed target or attribute
fails with its name."""

from __future__ import annotations

import dataclasses
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from vase_sglang.patches import hooks, manifest
from vase_sglang.patches.guards import bodies as guards
from vase_sglang.plugin import contract

ROOT = Path(__file__).resolve().parents[2]


def test_every_target_matches_the_pinned_sglang() -> None:
    import sglang

    # One assert, so that on another release the moved targets are listed with the version.
    assert (sglang.__version__, manifest.check_all()) == (manifest.SGLANG_VERSION, [])


def test_every_manifest_entry_has_its_hook_and_nothing_else_is_hooked() -> None:
    hooks.import_patch_modules()  # every patch module, new ones too: their decorators register
    applied = {t.target for t in manifest.MANIFEST if t.kind in manifest.APPLIED}
    assert applied - hooks.registered_targets() == set(), "manifest entries without a hook"
    assert hooks.registered_targets() == applied, "hooks on targets the manifest does not list"
    assert len(manifest.BY_TARGET) == len(manifest.MANIFEST), "a target is listed twice"
    for entry in manifest.MANIFEST:
        assert entry.kind in manifest.KINDS and entry.process in manifest.PROCESSES and entry.why, entry
        assert (entry.process == "other") <= (entry.kind == manifest.ROLE), entry  # only a role names "other"
    # Each process applies (or checks) its own entries in one loop; the other processes' stay
    # untouched, and the role entries are read before any.
    applying = [p for p in manifest.PROCESSES if p != "other"]
    assert set().union(*({e.target for e in hooks.entries_for(p)} for p in applying)) == {
        e.target for e in manifest.MANIFEST if manifest.available(e) and e.kind != manifest.ROLE}


def test_every_unhooked_entry_names_the_file_that_uses_it() -> None:
    for entry in manifest.MANIFEST:
        assert (entry.used_in is None) == (entry.kind in manifest.APPLIED), entry  # a hook's file is its module
        if entry.used_in is None:
            continue
        path = ROOT / entry.used_in
        assert path.is_file(), f"{entry.target}: used_in {entry.used_in} does not exist"
        # A role's file reads the role entries; the others' name their target.
        name = "role_functions" if entry.kind == manifest.ROLE else entry.target.rpartition(".")[2]
        assert name in path.read_text(), f"{entry.target}: {entry.used_in} does not mention {name}"


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


def test_pinned_sources_are_the_ones_we_reimplement_or_mirror() -> None:
    pinned = [t for t in manifest.MANIFEST if t.source_sha256]
    assert {t.target.rsplit(".", 1)[1] for t in pinned} == {
        "_create_buffers_normal", "_get_running_request_total_token_offset", "event_loop",  # re-implemented
        "prepare_for_decode", "alloc_for_decode_default"}  # VaseScheduler.shrink_rows repeats their bookkeeping
    assert all(t.source_sha256 for t in manifest.MANIFEST if t.kind == manifest.MIRROR), "a mirror without its pin"


def test_startup_check_stops_the_process_on_a_broken_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    owner = _fake_module(monkeypatch)
    broken = manifest.Target(f"{owner}.gone", manifest.AROUND, "scheduler", "test", ("self",))
    monkeypatch.setitem(manifest.BY_TARGET, broken.target, broken)
    with pytest.raises(SystemExit, match=r"vase_fake_sglang\.Scheduler\.gone: cannot be resolved"):
        hooks.check_contract(broken.target)


def test_install_checks_call_and_mirror_entries_and_hooks_nothing_for_them(monkeypatch: pytest.MonkeyPatch) -> None:
    class Registry:  # stands in for SGLang's HookRegistry: nothing may be registered
        _patched: set[str] = set()

        def register(self, *args: Any, **kwargs: Any) -> None:
            raise AssertionError(f"registered {args[0]}")

        def apply_hooks(self) -> None:
            pass

    unhooked = [manifest.BY_TARGET["sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_for_decode"],
                manifest.BY_TARGET["sglang.srt.mem_cache.allocation.alloc_for_decode_default"]]
    monkeypatch.setattr(hooks, "_registry", Registry())
    monkeypatch.setattr(hooks, "_installed", set())  # as in a fresh process
    monkeypatch.setattr(hooks, "entries_for", lambda process, parts: unhooked)
    assert hooks.install("scheduler") == 0
    stale = dataclasses.replace(unhooked[0], source_sha256="0" * 64)
    monkeypatch.setitem(manifest.BY_TARGET, stale.target, stale)
    monkeypatch.setattr(hooks, "entries_for", lambda process, parts: [stale])
    monkeypatch.setattr(hooks, "_installed", set())
    with pytest.raises(SystemExit, match=r"ScheduleBatch\.prepare_for_decode: upstream source changed"):
        hooks.install("scheduler")


# ---- the reads that once bypassed the declarations, each planted with a wrong name -------
# (the input guards' request-body reads, io.py's HTTP server state, hooks.py's HookRegistry,
# plugin/__init__.py's role functions, and the mirrored prepare_for_decode)

PLANTED_TARGETS = [  # a declared manifest target, and the same with a name SGLang does not define
    ("sglang.srt.managers.scheduler.run_scheduler_process", "sglang.srt.managers.scheduler.run_scheduler"),
    ("sglang.srt.managers.detokenizer_manager.run_detokenizer_process",
     "sglang.srt.managers.detokenizer_manager.run_detokenizer"),
    ("sglang.srt.managers.data_parallel_controller.run_data_parallel_controller_process",
     "sglang.srt.managers.data_parallel_controller.run_dp_controller_process"),
    ("sglang.srt.entrypoints.http_server.get_global_state", "sglang.srt.entrypoints.http_server.global_state"),
    ("sglang.srt.entrypoints.http_server.app", "sglang.srt.entrypoints.http_server.fastapi_app"),
    ("sglang.srt.managers.io_struct.SessionParams", "sglang.srt.managers.io_struct.SessionParameters"),
    ("sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_for_decode",
     "sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_decode"),
]


@pytest.mark.parametrize(("target", "planted"), PLANTED_TARGETS, ids=[t.rpartition(".")[2] for t, _ in PLANTED_TARGETS])
def test_a_planted_target_fails_by_name(monkeypatch: pytest.MonkeyPatch, target: str, planted: str) -> None:
    assert target in manifest.BY_TARGET
    monkeypatch.setattr(manifest, "MANIFEST", tuple(dataclasses.replace(e, target=planted) if e.target == target
                                                    else e for e in manifest.MANIFEST))
    problems = manifest.check_all()
    assert len(problems) == 1 and problems[0].startswith(f"{planted}: cannot be resolved"), problems


PLANTED_ATTRIBUTES = [  # a Protocol, a name SGLang does not define, a class it is checked against
    (contract.ReqInput, "is_singular", "sglang.srt.managers.io_struct.EmbeddingReqInput"),  # guards
    (contract.GenerateReqInput, "bootstrap_rooms", "sglang.srt.managers.io_struct.GenerateReqInput"),  # guards
    (contract.SamplingParamsFilledBySGLang, "is_normalised", "sglang.srt.sampling.sampling_params.SamplingParams"),
    (contract.VertexGenerateReqInput, "params", "sglang.srt.managers.io_struct.VertexGenerateReqInput"),  # guards
    (contract.GlobalState, "tokenizer", "sglang.srt.entrypoints.http_server._GlobalState"),  # io
    (contract.SchedulerOutputStreamer, "has_customized_info",  # io's subclass would override nothing
     "sglang.srt.managers.scheduler_components.output_streamer.SchedulerOutputStreamer"),
    (contract.HookRegistry, "_patched_targets", "sglang.srt.plugins.hook_registry.HookRegistry"),  # hooks
]


@pytest.mark.parametrize(("protocol", "planted", "path"), PLANTED_ATTRIBUTES, ids=[p.__name__ for p, *_ in
                                                                                  PLANTED_ATTRIBUTES])
def test_a_planted_attribute_fails_by_name(monkeypatch: pytest.MonkeyPatch, protocol: type, planted: str,
                                           path: str) -> None:
    monkeypatch.setitem(protocol.__dict__["__annotations__"], planted, Any)
    assert (f"{path}.{planted}: not defined by SGLang (declared in vase_sglang/plugin/contract.py {protocol.__name__})"
            in contract.check_all())


def test_the_guards_take_sglangs_internal_fields_from_the_contract() -> None:
    assert guards.INTERNAL_SAMPLING_FIELDS == tuple(contract.members(contract.SamplingParamsFilledBySGLang))


def _module_from_source(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str, source: str) -> types.ModuleType:
    """A module with a file, so that inspect.getsource reads its functions."""
    mod = types.ModuleType(name)
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    mod.__file__ = str(path)
    monkeypatch.setitem(sys.modules, name, mod)
    exec(compile(source, str(path), "exec"), mod.__dict__)
    return mod


def test_a_role_function_must_call_load_plugins_under_its_own_name(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    _module_from_source(monkeypatch, tmp_path, "vase_fake_roles", (
        "def load_plugins():\n"
        "    pass\n"
        "def run_scheduler_process(args):\n"
        "    load_plugins()\n"
        "def run_detokenizer_process(args):\n"
        "    return args\n"
        "run_data_parallel_controller_process = run_scheduler_process\n"))
    entry = manifest.Target("vase_fake_roles.run_scheduler_process", manifest.ROLE, "scheduler", "test")
    manifest.check(entry)  # holds as written
    with pytest.raises(manifest.ContractError, match=r"^vase_fake_roles\.run_detokenizer_process: no longer calls "
                                                     r"load_plugins\(\)"):
        manifest.check(dataclasses.replace(entry, target="vase_fake_roles.run_detokenizer_process"))
    with pytest.raises(manifest.ContractError, match=r"^vase_fake_roles\.run_data_parallel_controller_process: not "
                                                     r"a function whose code is named"):
        manifest.check(dataclasses.replace(entry, target="vase_fake_roles.run_data_parallel_controller_process"))


def test_the_process_role_comes_from_the_manifest(monkeypatch: pytest.MonkeyPatch) -> None:
    from vase_sglang.patches import entry

    def run_scheduler_process() -> str:
        return entry.process_role()

    def run_detokenizer_process() -> str:
        return entry.process_role()

    def run_data_parallel_controller_process() -> str:
        return entry.process_role()

    def launch_server() -> str:
        return entry.process_role()

    assert (run_scheduler_process(), run_detokenizer_process(), run_data_parallel_controller_process(),
            launch_server()) == ("scheduler", "other", "controller", "main")
    # Rename the scheduler's entry: patches/entry.py follows the manifest, not a name of its own.
    target = "sglang.srt.managers.scheduler.run_scheduler_process"
    monkeypatch.setattr(manifest, "MANIFEST", tuple(
        dataclasses.replace(e, target="sglang.srt.managers.scheduler.run_scheduler_loop") if e.target == target
        else e for e in manifest.MANIFEST))

    def run_scheduler_loop() -> str:
        return entry.process_role()

    assert (run_scheduler_loop(), run_scheduler_process()) == ("scheduler", "main")


# ---- the attribute contract (vase_sglang/plugin/contract.py) ----------------------------------------
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
        "vase_fake_batch.Renamed.kv_committed_len: not defined by SGLang (declared in "
        "vase_sglang/plugin/contract.py ReqKvInfo)"]
    assert contract.check(contract.ReqKvInfo, "vase_fake_batch.Gone")[0].startswith(
        "vase_fake_batch.Gone: cannot be resolved")
