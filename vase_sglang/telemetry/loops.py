"""Repetition loops in a request's output: the failure the VaSE paper traces to eviction.

The definition (the VaSE analysis, docs/telemetry.md): a phrase of 10-40 characters
repeated at least 5 times in the last 500 characters. ``find_text_loop`` applies it to a
finished text: some phrase of ``min_chars``..``max_chars`` characters (not only blanks)
occurs ``repeats`` times, without overlap, in the last ``window`` characters.

``LoopDetector`` is its online, token-level form, run on every generated token: a model
that loops emits the same tokens again. It tracks, for every period p of at most
``max_period`` tokens, how many of the newest tokens equal the token p before them (only
the periods at which the new token occurred before are touched, so a token costs as
much as it has recent occurrences). In a stretch that repeats a p-token phrase of c
characters, every 10-character piece recurs once per copy, so the text definition holds
once the stretch holds 5 copies of the phrase, or, for c < 10, of its smallest multiple of
at least 10 characters; and 5 such copies fit in the last 500 characters only when each is
at most 100 characters (``window // repeats``). The phrase is decoded once per period and
run (the only tokenizer call) to get c. Without a tokenizer each token counts as one
character. What it does not flag: a phrase that recurs with other text between its
occurrences, which the text definition counts (docs/telemetry.md measures how often the two
disagree on real outputs).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

MIN_CHARS, MAX_CHARS, REPEATS, WINDOW_CHARS = 10, 40, 5, 500
MAX_PERIOD = 100  # tokens: a unit of at most 100 characters has at most 100 tokens


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
    """Character offset (in ``text``) of the first occurrence of a phrase of ``min_chars``..
    ``max_chars`` characters that occurs ``repeats`` times (without overlap) in the last
    ``window`` characters; None when there is none."""
    offset = max(0, len(text) - window)
    tail = text[offset:]
    for length in range(min_chars, max_chars + 1):
        seen: set[str] = set()
        for start in range(0, len(tail) - length * repeats + 1):
            phrase = tail[start : start + length]
            if phrase in seen or phrase.isspace():
                continue
            seen.add(phrase)
            if tail.count(phrase, start) >= repeats:
                return offset + start
    return None


class LoopDetector:
    """Feed it a request's output tokens as they come; ``loop`` is set at the first loop."""

    def __init__(self, text_of: Callable[[Sequence[int]], str] | None = None, min_chars: int = MIN_CHARS,
                 repeats: int = REPEATS, window: int = WINDOW_CHARS, max_period: int = MAX_PERIOD):
        if not 1 <= min_chars <= window // repeats or repeats < 2 or max_period < 1:
            raise ValueError("need 1 <= min_chars <= window // repeats, repeats >= 2 and max_period >= 1")
        self.text_of = text_of
        self.min_chars, self.repeats, self.max_period = min_chars, repeats, max_period
        self.max_unit = window // repeats  # characters one repeated unit may have
        self.loop: Loop | None = None
        self._tail: deque[int] = deque(maxlen=max_period)  # the newest tokens
        self._seen_at: dict[int, deque[int]] = {}  # token -> its indices among the newest max_period
        self._runs: dict[int, int] = {}  # period -> newest tokens equal to the token that period earlier
        self._needed: dict[int, int | None] = {}  # period -> run that makes a loop (None: never), this run
        self._index = 0  # tokens fed

    def feed(self, tokens: Sequence[int]) -> Loop | None:
        """Add output tokens; returns the loop the first time one is found."""
        for token in tokens:
            if self.loop is not None:
                return None
            self._step(int(token))
            if self.loop is not None:
                return self.loop
        return None

    def _step(self, token: int) -> None:
        index, oldest = self._index, self._index - self.max_period
        seen = self._seen_at.setdefault(token, deque())
        while seen and seen[0] < oldest:
            seen.popleft()
        runs = {index - at: self._runs.get(index - at, 0) + 1 for at in seen}
        self._needed = {p: n for p, n in self._needed.items() if p in runs}
        self._runs = runs
        self._tail.append(token)
        seen.append(index)
        self._index += 1
        if index % self.max_period == 0:  # forget tokens that left the window
            self._seen_at = {t: d for t, d in self._seen_at.items() if d and d[-1] >= oldest}
        for p in sorted(runs):
            if runs[p] >= (self.repeats - 1) * p and self._closes_loop(p, index):
                return

    def _closes_loop(self, p: int, index: int) -> bool:
        phrase = list(self._tail)[-p:]
        if p not in self._needed:
            self._needed[p] = self._run_needed(p, phrase)
        needed = self._needed[p]
        if needed is None or self._runs[p] < needed:
            return False
        self.loop = Loop(start=index - self._runs[p] - p + 1, period=p, chars=self._chars(phrase), detected_at=index)
        return True

    def _run_needed(self, p: int, phrase: list[int]) -> int | None:
        """Run length at which a p-token phrase of this text length is a loop (None: never)."""
        chars = self._chars(phrase)
        if chars <= 0:
            return None
        multiple = math.ceil(self.min_chars / chars)
        if multiple * chars > self.max_unit:
            return None
        return (self.repeats * multiple - 1) * p

    def _chars(self, phrase: list[int]) -> int:
        return len(self.text_of(phrase)) if self.text_of is not None else len(phrase)
