"""The HTTP hardening (main process), switched by ``--kv-guards on|off`` (default on).

Not eviction: these hooks make SGLang's HTTP layer answer a client's mistake with an
HTTP 400 instead of a 500 or a dead scheduler, and bound the drain after SIGTERM
(``docs/reliability.md``). Their manifest entries are the part ``guards``
(``patches/manifest.py``); with ``--kv-guards off`` none of them is installed.

* ``bodies``: the request bodies that reach the scheduler (``/generate``, the OpenAI
  routes, embeddings), and the fastapi validation of OpenAI bodies;
* ``routes``: SGLang's other client routes (detokenize, parsers, Ollama);
* ``lifecycle``: the bounded drain on SIGTERM.
"""

from . import bodies, lifecycle, routes

__all__ = ["bodies", "lifecycle", "routes"]
