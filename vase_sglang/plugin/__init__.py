"""The SGLang side of vase-sglang, below the hooks: what a scheduler or the main process
does for eviction, given SGLang's objects as arguments.

* ``scheduler.VaseScheduler``: the adapter of one scheduler process. It holds the
  ``requests.RequestTable`` (one ``RequestRecord`` per request, by request id: options,
  seed, region, counters, telemetry) and an ``engine.RoundEngine`` (the KV views, query
  ring, score state and position offsets, and one batched round: tensors only).
* ``settings`` (``ServerSettings``, handed to SGLang's child processes), ``flags`` (the
  ``--kv-*`` flags into settings), ``options`` (a request's ``kv_*`` fields into its
  ``RequestOptions``: the one precedence function), ``auto`` (``--kv-policy auto``),
  ``planning`` (what a request can reach and what it costs).
* ``report``, ``telemetry``, ``metrics``, ``stats``: what is reported per request and in
  total; ``contract``: the SGLang attributes read here, as Protocols; ``cpu_mode``: the
  ``sgl_kernel`` stand-in of the CPU engine.

Imports go one way: ``vase_sglang.patches`` (the hooks and the entry point ``register``)
imports this package, which imports the algorithm and the kernels, never the hooks
(``tests/unit/test_import_graph.py``).
"""
