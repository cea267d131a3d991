"""What eviction costs a request, measured while it is served (torch- and SGLang-free).

* ``signal``: ``EvictedAttention``, a request's running aggregate of the per-round signal
  (the share of the window queries' attention that a round's evicted candidates carried,
  computed by ``Policy.selection(..., measure=True)``).
* ``loops``: ``LoopDetector``, the online repetition-loop detector on a request's output
  tokens, and ``find_text_loop``, the character-level definition it implements.
* ``estimator``: ``KLMapping`` / ``KLEstimator``, the monotone signal -> KL mappings that
  ``python -m vase_sglang.calibrate`` fits on the user's model and the server applies.

Design and measured quality: docs/telemetry.md.
"""

from .estimator import KLEstimator, KLMapping
from .loops import Loop, LoopDetector, find_text_loop
from .signal import STATISTICS, EvictedAttention

__all__ = ["STATISTICS", "EvictedAttention", "KLEstimator", "KLMapping", "Loop", "LoopDetector", "find_text_loop"]
