"""The stochastic fill samples without replacement in proportion to the scores.

For 5 candidates and 2 picks, the ordered pair (i, j) must appear with probability
w_i / S * w_j / (S - w_i): the sequential multinomial draw. A chi-square test over
20,000 rows with a fixed seed makes this deterministic.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from scipy.stats import chisquare
from support.constants import DEVICE

from vase_sglang.kernels import ops

WEIGHTS = [0.05, 0.1, 0.2, 0.3, 0.35]


def _expected_ordered_pairs() -> dict[tuple[int, int], float]:
    s = sum(WEIGHTS)
    return {
        (i, j): WEIGHTS[i] / s * WEIGHTS[j] / (s - WEIGHTS[i])
        for i, j in itertools.permutations(range(len(WEIGHTS)), 2)
    }


def _draw(n_rows: int, backend: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(2024)
    fill = torch.tensor(WEIGHTS).expand(n_rows, -1).contiguous()
    noise = torch.empty(n_rows, len(WEIGHTS)).exponential_(generator=g)
    return ops.select(fill.to(DEVICE), 0, 0, 2, None, noise.to(DEVICE), backend=backend).cpu()


def test_fill_follows_sequential_without_replacement_distribution() -> None:
    n_rows = 20_000
    picks = _draw(n_rows, "torch")
    assert (picks[:, 0] != picks[:, 1]).all()
    expected = _expected_ordered_pairs()
    counts = {pair: 0 for pair in expected}
    for i, j in picks.tolist():
        counts[(i, j)] += 1
    observed = [counts[p] for p in expected]
    result = chisquare(observed, [expected[p] * n_rows for p in expected])
    assert result.pvalue > 1e-3, f"chi-square p={result.pvalue:.2e}; observed={observed}"
    # Marginal of the first pick alone is w_i / S.
    first = torch.bincount(picks[:, 0], minlength=5).double() / n_rows
    torch.testing.assert_close(first, torch.tensor(WEIGHTS, dtype=torch.float64) / sum(WEIGHTS), atol=0.015, rtol=0)


@pytest.mark.parametrize("n_rows", [600])
def test_triton_fill_draws_the_same_samples(n_rows: int) -> None:
    assert torch.equal(_draw(n_rows, "triton"), _draw(n_rows, "torch"))
