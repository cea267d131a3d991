"""vase-sglang: VaSE KV eviction for SGLang 0.5.23.

Two parts: what runs inside SGLang's processes, and the tools a user runs beside it.

Inside SGLang, from the bottom (none of it imports a tool; the algorithm and the kernels
do not import SGLang):

* ``vase_sglang.config``, ``policies``, ``sharding`` -- the algorithm: ``PolicyConfig``
  validated once, one small class per eviction method, heads per tensor-parallel rank.
* ``vase_sglang.kernels``  -- tensor-only Triton kernels and their torch references.
* ``vase_sglang.plugin``   -- the SGLang side: ``register()`` (the entry point);
  ``scheduler.VaseScheduler`` (the one owner of per-request eviction state, a
  ``request.RequestState`` each) over ``engine.RoundEngine`` (the buffers and the rounds,
  tensors only); ``planning`` (reachable policies, memory sizing, warm-up variants);
  ``flags`` (the ``--kv-*`` flags), ``options`` (the per-request ``kv_*`` fields) and
  ``handoff`` (the server's settings to SGLang's child processes); ``auto``, ``report``,
  ``telemetry``, ``metrics``, ``stats``, and the two start-up hooks ``cpu_mode`` and
  ``frontend``.
* ``vase_sglang.patches``  -- the thin SGLang glue: hooks on the targets listed in
  ``patches/manifest.py``, each one call into the scheduler adapter.

Beside it (``python -m vase_sglang.<tool>``): ``models`` (fetch and check a model),
``calibrate`` (choose a policy and budget), ``eval``, ``fidelity``, ``bench``,
``cluster`` (workers behind the gateway), ``server_process`` and ``cli`` (shared by the
tools), and ``bundled`` (the bundled model and its task).

``vase_sglang/kernels`` and ``vase_sglang/patches`` are links to the top-level
``kernels/`` and ``patches/`` folders, so the checkout imports as it is laid out.
``kernels/`` has no ``__init__.py``: run from the checkout root, it is a namespace
portion, which loses to the installed ``kernels`` package SGLang imports instead of
shadowing it.
"""

from .config import POLICY_NAMES, VALUE_STATS, PolicyConfig, PolicyConfigError

__version__ = "0.1.0"

__all__ = ["POLICY_NAMES", "VALUE_STATS", "PolicyConfig", "PolicyConfigError", "__version__"]
