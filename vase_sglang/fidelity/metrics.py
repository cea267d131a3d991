"""Fidelity of a policy to the full cache, per generated-token position.

Teacher forcing: every arm is fed the same reference continuation, so at each position
the policy's next-token distribution can be compared with the full cache's:

* ``kl``: KL(full || policy) in nats, over the whole vocabulary;
* ``agree``: 1 when the policy's top-1 token is the full cache's top-1 token;
* ``nll``: -log p_policy(reference token);
* ``match``: 1 when the policy's top-1 token is the reference token. With a greedy
  full-cache teacher, the first position where it is 0 is the first token where the
  policy's own greedy output leaves the full cache's (both runs are identical before it).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

# Generated-token position bands (1-based, inclusive) for the tables.
BANDS: tuple[tuple[int, int], ...] = ((1, 256), (257, 512), (513, 768), (769, 1024))


class FullChunk:
    """The full cache's distribution at one chunk's positions, shared by every arm's update."""

    def __init__(self, logits: torch.Tensor):
        lp = torch.log_softmax(logits.float(), dim=-1)
        self.probs = lp.exp()
        self.neg_entropy = (self.probs * lp).sum(-1)
        self.top = lp.argmax(-1)


@dataclass
class PositionMetrics:
    """Per (request, position) values of one arm; position p = 1-based generated-token index."""

    n_req: int
    n_pos: int
    kl: np.ndarray = field(init=False)
    agree: np.ndarray = field(init=False)
    nll: np.ndarray = field(init=False)
    match: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        shape = (self.n_req, self.n_pos)
        self.kl = np.full(shape, np.nan, dtype=np.float64)
        self.agree = np.full(shape, np.nan, dtype=np.float64)
        self.nll = np.full(shape, np.nan, dtype=np.float64)
        self.match = np.full(shape, np.nan, dtype=np.float64)

    @torch.no_grad()
    def update(self, start: int, full: FullChunk, logits: torch.Tensor, targets: torch.Tensor) -> None:
        """Positions ``start .. start + T - 1`` (0-based): logits ``[N, T, V]``, targets ``[N, T]``."""
        lp = torch.log_softmax(logits.float(), dim=-1)
        # KL(p||q) = sum p log p - sum p log q; the first term is computed once per chunk.
        kl = (full.neg_entropy - (full.probs * lp).sum(-1)).clamp_min(0.0)
        top = lp.argmax(-1)
        sl = slice(start, start + targets.shape[1])
        self.kl[:, sl] = kl.double().cpu().numpy()
        self.agree[:, sl] = (top == full.top).double().cpu().numpy()
        self.nll[:, sl] = (-lp.gather(-1, targets[..., None])[..., 0]).double().cpu().numpy()
        self.match[:, sl] = (top == targets).double().cpu().numpy()

    def copy_from(self, other: PositionMetrics, end: int) -> None:
        """Positions ``< end`` (0-based) from another arm (one that computed the same thing)."""
        for key in ("kl", "agree", "nll", "match"):
            getattr(self, key)[:, :end] = getattr(other, key)[:, :end]

    def mask_after(self, ends: list[int]) -> None:
        """Leave out positions after each request's last scored one (1-based ``ends``)."""
        for i, end in enumerate(ends):
            for key in ("kl", "agree", "nll", "match"):
                getattr(self, key)[i, end:] = np.nan

    def per_request(self) -> dict[str, list[float]]:
        """Each request's mean over its scored positions (NaN when it has none)."""
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a request with no scored position
            return {key: np.nanmean(getattr(self, key), axis=1).tolist() for key in ("kl", "agree", "nll")}

    def first_divergence(self) -> np.ndarray:
        """Per request, the 1-based position of the first mismatch; ``n_pos + 1`` when none."""
        miss = self.match == 0
        return np.where(miss.any(axis=1), miss.argmax(axis=1) + 1, self.n_pos + 1)

    def band_means(self) -> list[dict]:
        rows = []
        for lo, hi in BANDS:
            if lo > self.n_pos:
                break
            sl = slice(lo - 1, min(hi, self.n_pos))
            rows.append({
                "band": f"{lo}-{min(hi, self.n_pos)}",
                "kl": float(np.nanmean(self.kl[:, sl])),
                "agree": float(np.nanmean(self.agree[:, sl])),
                "nll": float(np.nanmean(self.nll[:, sl])),
            })
        return rows

    def curve(self, bin_size: int = 32) -> dict[str, list[float]]:
        """Mean over requests and over position bins, for the plot."""
        out: dict[str, list[float]] = {"position": [], "kl": [], "agree": [], "nll": []}
        for lo in range(0, self.n_pos, bin_size):
            sl = slice(lo, min(lo + bin_size, self.n_pos))
            out["position"].append(lo + 1)
            for key in ("kl", "agree", "nll"):
                out[key].append(float(np.nanmean(getattr(self, key)[:, sl])))
        return out

    def summary(self) -> dict:
        first = self.first_divergence()
        return {
            "kl": float(np.nanmean(self.kl)),
            "agree": float(np.nanmean(self.agree)),
            "nll": float(np.nanmean(self.nll)),
            "first_divergence_median": float(np.median(first)),
            "first_divergence": first.tolist(),
            "bands": self.band_means(),
            "curve": self.curve(),
            "per_request": self.per_request(),
        }


def repeat_4gram_share(tokens: list[int]) -> float:
    """Share of the 4-grams of a sequence that already occurred earlier in it (loops -> 1)."""
    seen: set[tuple[int, ...]] = set()
    repeats = total = 0
    for i in range(len(tokens) - 3):
        gram = tuple(tokens[i : i + 4])
        total += 1
        repeats += gram in seen
        seen.add(gram)
    return repeats / total if total else 0.0
