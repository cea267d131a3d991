"""One request's evicted-attention signal, aggregated over its eviction rounds.

At each round the policy reports, per (layer, KV head), the share of the last R queries'
attention over the candidates that falls on the candidates the round drops; the round's
signal is its mean over layers and heads. A request keeps only running sums (its memory
does not grow with its length), from which every statistic below is exact:

* ``mean``: the mean over rounds (what a round typically takes away);
* ``max``: the worst round;
* ``per_token``: the mean, over the request's generated tokens, of the signal of the last
  round before each token (0 before the first round): rounds weighted by the tokens
  generated under them, and diluted by the tokens generated before any eviction;
* ``cumulative``: the mean, over generated tokens, of the sum of the signals of every round
  before the token (what has been taken away so far, as each token sees it).

A round that runs when the request has ``generated`` output tokens affects the tokens
after them: ``generated`` is ``len(output_ids)`` on the server and ``fed + 1`` in the
fidelity loop (the token being fed is output token ``fed + 1``).
"""

from __future__ import annotations

from dataclasses import dataclass

STATISTICS = ("mean", "max", "per_token", "cumulative")


@dataclass
class EvictedAttention:
    """Running aggregate of a request's per-round signal."""

    rounds: int = 0
    total: float = 0.0  # sum of the round signals
    peak: float = 0.0
    # sum over closed rounds of signal x tokens generated until the next round
    held: float = 0.0
    last: float = 0.0  # the latest round's signal
    last_at: int = 0  # output tokens when it ran
    total_at: float = 0.0  # sum of signal x output tokens when each round ran

    def add(self, signal: float, generated: int) -> None:
        """One round's signal, which ran when the request had ``generated`` output tokens."""
        if self.rounds:
            self.held += self.last * max(0, generated - self.last_at)
        self.rounds += 1
        self.total += signal
        self.peak = max(self.peak, signal)
        self.last, self.last_at = signal, generated
        self.total_at += signal * generated

    def statistic(self, name: str, generated: int) -> float | None:
        """One of ``STATISTICS`` for a request with ``generated`` output tokens (None
        before the first round)."""
        if not self.rounds:
            return None
        if name == "mean":
            return self.total / self.rounds
        if name == "max":
            return self.peak
        if generated <= 0:
            return 0.0
        if name == "per_token":
            return (self.held + self.last * max(0, generated - self.last_at)) / generated
        if name == "cumulative":
            return max(0.0, self.total * generated - self.total_at) / generated
        raise ValueError(f"unknown statistic {name!r}; one of {', '.join(STATISTICS)}")

    def statistics(self, generated: int) -> dict[str, float | None]:
        return {name: self.statistic(name, generated) for name in STATISTICS}
