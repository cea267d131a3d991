"""Failure-mode signatures of one output (docs/accuracy.md, "The eval harness").

* loop: a phrase of 10-40 characters occurring at least 5 times in the last 500 characters;
* unclosed: the output never closes ``</think>`` (truncated, or the model never stopped thinking).
"""

from __future__ import annotations

LOOP_TAIL = 500
LOOP_MIN_LEN, LOOP_MAX_LEN = 10, 40
LOOP_REPEATS = 5


def has_loop(text: str, tail: int = LOOP_TAIL, min_len: int = LOOP_MIN_LEN, max_len: int = LOOP_MAX_LEN,
             repeats: int = LOOP_REPEATS) -> bool:
    """True when some phrase of min_len..max_len characters occurs >= repeats times
    (non-overlapping) in the last ``tail`` characters."""
    end = text[-tail:]
    for length in range(min_len, max_len + 1):
        seen: set[str] = set()
        for start in range(0, len(end) - length * repeats + 1):
            phrase = end[start:start + length]
            if phrase in seen or phrase.isspace():
                continue
            seen.add(phrase)
            if end.count(phrase, start) >= repeats:
                return True
    return False


def unclosed_think(text: str) -> bool:
    return "</think>" not in text
