"""vase-sglang: VaSE KV eviction for SGLang 0.5.23.

Layers, from the bottom:

* ``vase_sglang.config``    -- ``PolicyConfig``, validated once.
* ``vase_sglang.kernels``   -- tensor-only Triton kernels and their torch references.
* ``vase_sglang.policies``  -- one small class per eviction method (pure algorithm).
* ``vase_sglang.patches``   -- the thin SGLang glue (hooks on named targets).
"""

from .config import POLICY_NAMES, VALUE_STATS, PolicyConfig, PolicyConfigError

__version__ = "0.1.0"

__all__ = ["POLICY_NAMES", "VALUE_STATS", "PolicyConfig", "PolicyConfigError", "__version__"]
