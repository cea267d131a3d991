"""vase-sglang: VaSE KV eviction for SGLang 0.5.23.

Layers, from the bottom:

* ``vase_sglang.config``    -- ``PolicyConfig``, validated once.
* ``vase_sglang.kernels``   -- tensor-only Triton kernels and their torch references.
* ``vase_sglang.policies``  -- one small class per eviction method (pure algorithm).
* ``vase_sglang.scheduler`` -- ``VaseScheduler``: the one owner of per-request eviction state.
* ``vase_sglang.patches``   -- the thin SGLang glue: hooks on the targets listed in
  ``patches/manifest.py``, each one call into the scheduler adapter.
"""

import os as _os

# In a source checkout, kernels/ and patches/ sit beside this folder rather than inside
# it (the installed package maps them to vase_sglang.kernels / vase_sglang.patches).
_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if not _os.path.isdir(_os.path.join(_os.path.dirname(__file__), "kernels")) and _os.path.isfile(
    _os.path.join(_root, "kernels", "ops.py")
):
    __path__.append(_root)  # noqa: F821 - the package's own __path__

from .config import POLICY_NAMES, VALUE_STATS, PolicyConfig, PolicyConfigError  # noqa: E402 - after __path__

__version__ = "0.1.0"

__all__ = ["POLICY_NAMES", "VALUE_STATS", "PolicyConfig", "PolicyConfigError", "__version__"]
