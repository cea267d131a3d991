"""Repetition loops in a request's output: the failure the VaSE paper traces to eviction.

The definition (the VaSE analysis, docs/telemetry.md): a phrase of 10-40 characters
repeated at least 5 times in the last 500 characters. ``find_text_loop`` applies it to
text: a phrase of ``min_chars``..``max_chars`` characters followed by ``repeats - 1`` copies
of itself.

``LoopDetector`` is its online, token-level form, run on every generated token: a model
that loops emits the same tokens again, so the output's last ``repeats`` phrases are equal
token sequences. For every period p up to ``max_period`` tokens it keeps the run length of
positions whose token equals the token p earlier (O(max_period) per token, no text). When
a run covers ``repeats`` copies of a p-token phrase, the phrase is decoded once (the only
tokenizer call) to apply the character bounds: a phrase shorter than ``min_chars`` counts
as its smallest multiple that is long enough, which must then itself repeat ``repeats``
times and be at most ``max_chars`` long. Five copies of a phrase of at most 40 characters
span at most 200, so a loop found at the newest token always lies in the last 500.
Without a tokenizer each token counts as one character.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

MIN_CHARS, MAX_CHARS, REPEATS, WINDOW_CHARS = 10, 40, 5, 500
MAX_PERIOD = 40  # tokens: every token decodes to at least one character


@dataclass(frozen=True)
class Loop:
    """Where a loop starts (0-based output token of its first copy), its phrase length in
    tokens and characters, and the output token at which it was detected."""

    start: int
    period: int
    chars: int
    detected_at: int


def find_text_loop(text: str, min_chars: int = MIN_CHARS, max_chars: int = MAX_CHARS, repeats: int = REPEATS,
                   window: int = WINDOW_CHARS) -> int | None:
    """Character offset (in ``text``) where the first loop in its last ``window`` characters
    starts, or None: a phrase of ``min_chars``..``max_chars`` characters and ``repeats - 1``
    copies of it right after."""
    start = max(0, len(text) - window)
    pattern = re.compile(rf"(.{{{min_chars},{max_chars}}}?)\1{{{repeats - 1},}}", re.DOTALL)
    found = pattern.search(text, start)
    return None if found is None else found.start()


class LoopDetector:
    """Feed it a request's output tokens as they come; ``loop`` is set at the first loop."""

    def __init__(self, text_of: Callable[[Sequence[int]], str] | None = None, min_chars: int = MIN_CHARS,
                 max_chars: int = MAX_CHARS, repeats: int = REPEATS, max_period: int = MAX_PERIOD):
        if not 1 <= min_chars <= max_chars or repeats < 2 or max_period < 1:
            raise ValueError("need 1 <= min_chars <= max_chars, repeats >= 2 and max_period >= 1")
        self.text_of = text_of
        self.min_chars, self.max_chars, self.repeats, self.max_period = min_chars, max_chars, repeats, max_period
        self.loop: Loop | None = None
        self._tail: list[int] = []  # the last max_period tokens
        self._runs = [0] * (max_period + 1)  # _runs[p]: newest positions equal to the token p earlier
        self._needed: dict[int, int | None] = {}  # period -> run length that makes a loop (None: never)
        self._seen = 0  # tokens fed

    def feed(self, tokens: Sequence[int]) -> Loop | None:
        """Add output tokens; returns the loop the first time one is found."""
        for token in tokens:
            if self.loop is not None:
                break
            self._step(int(token))
            if self.loop is not None:
                return self.loop
        return None

    def _step(self, token: int) -> None:
        tail, runs, index = self._tail, self._runs, self._seen
        n = len(tail)
        for p in range(1, min(n, self.max_period) + 1):
            if tail[n - p] == token:
                runs[p] += 1
                if runs[p] >= (self.repeats - 1) * p and self._closes_loop(p, token, index):
                    break
            elif runs[p]:
                runs[p] = 0
                self._needed.pop(p, None)
        tail.append(token)
        if len(tail) > self.max_period:
            del tail[0]
        self._seen += 1

    def _closes_loop(self, p: int, token: int, index: int) -> bool:
        if p not in self._needed:
            self._needed[p] = self._run_needed(p, [*self._tail[len(self._tail) - p + 1:], token])
        needed = self._needed[p]
        if needed is None or self._runs[p] < needed:
            return False
        chars = self._chars(self._tail[len(self._tail) - p + 1:] + [token])
        self.loop = Loop(start=index - self._runs[p] - p + 1, period=p, chars=chars, detected_at=index)
        return True

    def _run_needed(self, p: int, phrase: list[int]) -> int | None:
        """Run length at which a p-token phrase of this text length is a loop (None: never)."""
        chars = self._chars(phrase)
        if chars <= 0:
            return None
        multiple = math.ceil(self.min_chars / chars)
        if multiple * chars > self.max_chars:
            return None
        return (self.repeats * multiple - 1) * p

    def _chars(self, phrase: list[int]) -> int:
        return len(self.text_of(phrase)) if self.text_of is not None else len(phrase)
