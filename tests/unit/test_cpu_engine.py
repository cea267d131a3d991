"""The fixes of SGLang's CPU engine (``patches/cpu_engine.py``), called as SGLang calls them.

The end-to-end checks are in ``tests/e2e/test_e2e_scaleout.py`` (an idle ``--dp-size 2``
controller, ``--tp-size 2`` on the CPU engine)."""

from __future__ import annotations

from vase_sglang.patches import cpu_engine, entry, manifest


def test_a_model_parallel_group_asks_for_no_gpu_communicator() -> None:
    # As parallel_state.initialize_model_parallel calls it: three positional arguments, the rest by name.
    args, kwargs = cpu_engine.model_parallel_group_without_gpu_communicators(
        [[0, 1]], 0, "gloo", use_message_queue_broadcaster=True, group_name="tp", use_pynccl=True,
        use_custom_allreduce=None)
    assert args == ()
    assert kwargs == {"group_ranks": [[0, 1]], "local_rank": 0, "backend": "gloo",
                      "use_message_queue_broadcaster": True, "group_name": "tp", "use_pynccl": False,
                      "use_custom_allreduce": False, "use_mscclpp": False, "use_torch_symm_mem_allreduce": False}
    assert set(kwargs) <= set(manifest.BY_TARGET[cpu_engine._GROUP].params or ())


def test_the_cpu_engine_fixes_are_installed_only_on_the_cpu_engine(monkeypatch) -> None:
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    assert entry.cpu_engine_parts() == (manifest.CPU_ENGINE,)
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "0")
    assert entry.cpu_engine_parts() == ()
    fixes = [e for e in manifest.MANIFEST if e.part == manifest.CPU_ENGINE]
    assert {e.process for e in fixes} == {"scheduler", "controller"} and all(e.kind in manifest.HOOKED for e in fixes)
