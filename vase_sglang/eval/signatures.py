"""Failure-mode signatures of one output (docs/accuracy.md, "The eval harness").

* loop: the VaSE analysis's definition, a phrase of 10-40 characters occurring at least 5
  times in the last 500 characters (``vase_sglang.telemetry.find_text_loop``, which the
  server's online detector implements on tokens);
* unclosed: the output never closes ``</think>`` (truncated, or the model never stopped thinking).
"""

from __future__ import annotations

from vase_sglang.telemetry import find_text_loop


def has_loop(text: str) -> bool:
    return find_text_loop(text) is not None


def unclosed_think(text: str) -> bool:
    return "</think>" not in text
