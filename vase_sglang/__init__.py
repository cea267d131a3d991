"""vase-sglang: VaSE KV eviction for SGLang 0.5.23.

Two parts: what runs inside SGLang's processes, and the tools a user runs beside it.

Inside SGLang, from the bottom (none of it imports a tool; the algorithm and the kernels
do not import SGLang; each layer imports only the layers below it):

* ``vase_sglang.config``, ``policies``, ``registry``, ``sharding``, ``telemetry`` -- the
  algorithm: ``PolicyConfig`` validated once, one small class per eviction method, heads
  per tensor-parallel rank, the telemetry's statistics.
* ``vase_sglang.kernels``  -- tensor-only Triton kernels and their torch references
  (the top-level ``kernels/`` folder).
* ``vase_sglang.plugin``   -- the SGLang side below the hooks: ``scheduler.VaseScheduler``
  (a request table and a round engine per scheduler process), the server's settings, the
  per-request options and the reports (see its docstring).
* ``vase_sglang.patches``  -- the hooks on the targets listed in ``patches/manifest.py``
  and the plugin entry point ``patches/entry.py:register`` (the top-level ``patches/``
  folder).

Beside it (``python -m vase_sglang.<tool>``): ``models`` (fetch and check a model),
``calibrate`` (choose a policy and budget), ``eval``, ``fidelity``, ``bench``,
``cluster`` (workers behind the gateway), ``server_process`` and ``cli`` (shared by the
tools), and ``bundled`` (the bundled model and its task).

``kernels/`` and ``patches/`` ship as ``vase_sglang.kernels`` and ``vase_sglang.patches``
(``pyproject.toml``'s ``package-dir``): SGLang installs an unrelated top-level ``kernels``
package. ``kernels/`` has no ``__init__.py``, so run from the checkout root it is a
namespace portion, which loses to that package instead of shadowing it.
"""

from .config import POLICY_NAMES, VALUE_STATS, PolicyConfig, PolicyConfigError

__version__ = "0.1.0"

__all__ = ["POLICY_NAMES", "VALUE_STATS", "PolicyConfig", "PolicyConfigError", "__version__"]
