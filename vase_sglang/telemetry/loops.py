"""Repetition loops in a request's output: the failure the VaSE paper traces to eviction.

The definition (the VaSE analysis, docs/telemetry.md): a phrase of 10-40 characters
repeated at least 5 times in the last 500 characters. ``find_text_loop`` applies it to a
finished text: some phrase of ``min_chars``..``max_chars`` characters (not only blanks)
occurs ``repeats`` times, without overlap, in the last ``window`` characters.

``LoopDetector`` applies it online, on tokens, at every generated token. It needs only one
phrase per token: the shortest run of tokens ending at the new token that decodes to at
least 10 characters. Every occurrence of a looping phrase of 10-40 characters ends with
such a run (the phrase's shortest suffix of 10 characters, token-aligned; which run is
shortest depends only on its own tokens), so that run occurs, without overlap, as often
as the phrase does; the output loops when one run has 5 non-overlapping occurrences
starting in the last 500 characters. That run can begin inside the looping phrase (in
" kv cache token decode" repeated, " cache token" is the first run to reach 5), so the loop
starts at the run's first counted occurrence walked back over the tokens that equal the
token one repetition (the distance between its first two occurrences) later. A run is
identified by a rolling hash of its tokens, so a token costs a few additions and one
dictionary update. Each distinct token is decoded once for its length
(the scheduler's detectors share that table); a candidate phrase is decoded whole before
it counts (the only other tokenizer call). What it can miss: a phrase that starts or ends
inside a token, which the text definition still counts (docs/telemetry.md gives the
agreement on real outputs). Without a tokenizer each token counts as one character.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

MIN_CHARS, MAX_CHARS, REPEATS, WINDOW_CHARS = 10, 40, 5, 500


@dataclass(frozen=True)
class Loop:
    """Where a loop starts (0-based output token of the phrase's first counted occurrence),
    the phrase's length in tokens and characters, and the output token at which it was found."""

    start: int
    phrase_tokens: int
    phrase_chars: int
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


_HASH_MOD = (1 << 61) - 1
_HASH_BASE = 1_000_003


class LoopDetector:
    """Feed it a request's output tokens as they come; ``loop`` is set at the first loop."""

    def __init__(self, text_of: Callable[[Sequence[int]], str] | None = None, min_chars: int = MIN_CHARS,
                 max_chars: int = MAX_CHARS, repeats: int = REPEATS, window: int = WINDOW_CHARS,
                 token_chars: dict[int, int] | None = None):
        if not 1 <= min_chars <= max_chars or repeats < 2 or window < repeats * min_chars:
            raise ValueError("need 1 <= min_chars <= max_chars, repeats >= 2 and window >= repeats * min_chars")
        self.text_of = text_of
        self.min_chars, self.max_chars, self.repeats, self.window = min_chars, max_chars, repeats, window
        self.loop: Loop | None = None
        # The newest tokens, as (token, characters, characters before it in the output).
        self._recent: deque[tuple[int, int, int]] = deque()
        # token -> its decoded length; detectors of one tokenizer may share it (bounded by the vocabulary)
        self._chars_of: dict[int, int] = token_chars if token_chars is not None else {}
        # n-gram (n, hash) -> its counted occurrences: (first character, first token, last token)
        self._seen: dict[tuple[int, int], deque[tuple[int, int, int]]] = {}
        self._chars = 0  # characters of the output so far
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

    def _token_chars(self, token: int) -> int:
        chars = self._chars_of.get(token)
        if chars is None:
            chars = self._chars_of[token] = len(self.text_of([token])) if self.text_of is not None else 1
        return chars

    def _step(self, token: int) -> None:
        index, chars = self._index, self._token_chars(token)
        self._recent.append((token, chars, self._chars))
        self._chars += chars
        self._index += 1
        oldest = self._chars - self.window  # occurrences must start at or after this character
        while self._recent and self._recent[0][2] < oldest - self.max_chars:
            self._recent.popleft()
        if index % 512 == 511:  # forget phrases whose every occurrence left the window
            self._seen = {k: v for k, v in self._seen.items() if v and v[-1][0] >= oldest}
        digest, power, length = 0, 1, 0
        for n, (tok, tok_chars, start_char) in enumerate(reversed(self._recent), 1):
            length += tok_chars
            digest = (digest + tok * power) % _HASH_MOD
            power = power * _HASH_BASE % _HASH_MOD
            if length >= self.min_chars:  # the shortest run of at least min_chars ending here
                if length <= self.max_chars and start_char >= oldest and self._count(n, digest, start_char, index):
                    self._is_loop(n, index)
                return

    def _count(self, n: int, digest: int, start_char: int, index: int) -> bool:
        """Record an occurrence of the n-gram ending at ``index``; True when it reaches ``repeats``."""
        occurrences = self._seen.setdefault((n, digest), deque())
        while occurrences and occurrences[0][0] < self._chars - self.window:
            occurrences.popleft()
        first = index - n + 1
        if occurrences and occurrences[-1][2] >= first:
            return False  # overlaps the last counted occurrence
        occurrences.append((start_char, first, index))
        return len(occurrences) >= self.repeats

    def _is_loop(self, n: int, index: int) -> bool:
        phrase = [tok for tok, _, _ in list(self._recent)[-n:]]
        text = self.text_of(phrase) if self.text_of is not None else "x" * n
        if not self.min_chars <= len(text) <= self.max_chars or text.isspace():
            return False
        occurrences = self._seen[n, self._digest(phrase)]
        period = occurrences[1][1] - occurrences[0][1]
        self.loop = Loop(start=self._repetition_start(occurrences[0][1], period), phrase_tokens=n,
                         phrase_chars=len(text), detected_at=index)
        return True

    def _repetition_start(self, first: int, period: int) -> int:
        """The earliest token from which the output repeats itself ``period`` tokens later,
        walking back from ``first`` over the tokens still held."""
        tokens = [tok for tok, _, _ in self._recent]
        base = self._index - len(tokens)  # output index of tokens[0]
        start = first
        while start - 1 >= base and tokens[start - 1 - base] == tokens[start - 1 - base + period]:
            start -= 1
        return start

    @staticmethod
    def _digest(phrase: list[int]) -> int:
        digest, power = 0, 1
        for tok in reversed(phrase):
            digest = (digest + tok * power) % _HASH_MOD
            power = power * _HASH_BASE % _HASH_MOD
        return digest
