"""vase-sglang: VaSE KV eviction for SGLang 0.5.23.

Layers, from the bottom:

* ``vase_sglang.config``    -- ``PolicyConfig``, validated once.
* ``vase_sglang.kernels``   -- tensor-only Triton kernels and their torch references.
* ``vase_sglang.policies``  -- one small class per eviction method (pure algorithm).
* ``vase_sglang.scheduler`` -- ``VaseScheduler``: the one owner of per-request eviction state.
* ``vase_sglang.patches``   -- the thin SGLang glue: hooks on the targets listed in
  ``patches/manifest.py``, each one call into the scheduler adapter.

``vase_sglang/kernels`` and ``vase_sglang/patches`` are links to the top-level
``kernels/`` and ``patches/`` folders, so the checkout imports as it is laid out.
``kernels/`` has no ``__init__.py``: run from the checkout root, it is a namespace
portion, which loses to the installed ``kernels`` package SGLang imports instead of
shadowing it.
"""

from .config import POLICY_NAMES, VALUE_STATS, PolicyConfig, PolicyConfigError

__version__ = "0.1.0"

__all__ = ["POLICY_NAMES", "VALUE_STATS", "PolicyConfig", "PolicyConfigError", "__version__"]
