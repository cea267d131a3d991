"""CPU mode: a stand-in ``sgl_kernel`` for hosts where the real one cannot load.

SGLang's CPU engine (``SGLANG_USE_CPU_ENGINE=1 --device cpu --attention-backend
torch_native``) imports a few ``sgl_kernel`` names at module import time, but never calls
them on the non-speculative torch_native path. The CUDA ``sgl_kernel`` wheel that
``pip install sglang`` brings fails to import without ``libcuda.so.1``.

``install()`` (run at interpreter start-up by ``vase_sglang_cpu_mode.pth``, only when
``SGLANG_USE_CPU_ENGINE=1``) adds a one-shot import hook for ``sgl_kernel``: the first
import tries the real module, and only if that raises ``ImportError``/``OSError`` does it
provide the stand-in, whose functions raise a clear error if anything calls them. So on a
GPU host the real ``sgl_kernel`` is always the one imported.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import sys
import types

logger = logging.getLogger("vase_sglang.plugin.cpu_mode")

# Names sglang 0.5.23 imports unconditionally under SGLANG_USE_CPU_ENGINE=1.
STUB_NAMES = (
    "assign_req_to_token_pool_cpu",
    "copy_all_layer_kv_cache_cpu",
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "build_tree_kernel_efficient_cpu",
    "verify_tree_greedy_cpu",
)
STUB_VERSION = "0.0.0+vase-cpu-stand-in"


def _unavailable(name: str):
    def fn(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name} is not available in vase-sglang's CPU mode (the CUDA sgl_kernel could not load); "
            "this SGLang feature needs a GPU or the CPU build of sgl-kernel"
        )

    fn.__name__ = fn.__qualname__ = name
    return fn


def make_stub() -> types.ModuleType:
    mod = types.ModuleType("sgl_kernel", "vase-sglang CPU stand-in for sgl_kernel")
    setattr(mod, "__version__", STUB_VERSION)  # noqa: B010 - a module object has no declared attributes
    setattr(mod, "VASE_CPU_STAND_IN", True)  # noqa: B010
    for name in STUB_NAMES:
        setattr(mod, name, _unavailable(name))
    return mod


class _Loader(importlib.abc.Loader):
    def __init__(self, reason: list[str]):
        self.reason = reason

    def create_module(self, spec):
        real = importlib.machinery.PathFinder.find_spec("sgl_kernel")
        if real is not None and real.loader is not None:
            module = importlib.util.module_from_spec(real)
            sys.modules["sgl_kernel"] = module  # its own submodules import the parent
            try:
                real.loader.exec_module(module)
                return module
            except (ImportError, OSError) as exc:
                for key in [k for k in sys.modules if k == "sgl_kernel" or k.startswith("sgl_kernel.")]:
                    del sys.modules[key]
                lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
                self.reason.append(next((line for line in lines if "libcuda" in line), lines[0]))
        else:
            self.reason.append("sgl_kernel is not installed")
        logger.warning("vase-sglang CPU mode: using a stand-in sgl_kernel (%s)", self.reason[-1])
        return make_stub()

    def exec_module(self, module) -> None:
        return None


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != "sgl_kernel":
            return None
        sys.meta_path.remove(self)  # one shot: later imports hit sys.modules
        return importlib.machinery.ModuleSpec("sgl_kernel", _Loader([]))


def cpu_engine_requested() -> bool:
    return os.environ.get("SGLANG_USE_CPU_ENGINE", "").lower() in ("1", "true", "yes")


def install() -> bool:
    """Install the fallback hook if the CPU engine is requested; True when installed."""
    if not cpu_engine_requested() or "sgl_kernel" in sys.modules:
        return False
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    return True


def is_stand_in(module: types.ModuleType | None = None) -> bool:
    module = module if module is not None else sys.modules.get("sgl_kernel")
    return bool(getattr(module, "VASE_CPU_STAND_IN", False))
