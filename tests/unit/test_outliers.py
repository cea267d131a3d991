"""The large-value outlier measure (``python -m vase_sglang.bench.outliers``) on hand-made ranges."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from vase_sglang.bench.outliers import fidelity_sequences, outlier_shares


def test_outlier_share_counts_ranges_against_their_heads_median() -> None:
    # Layer 0: head 0 has one range 10x its median; head 1 is 10x larger everywhere, which is
    # not an outlier against its own median.
    layer0 = torch.tensor([[1.0, 10.0], [1.0, 10.0], [1.0, 10.0], [10.0, 10.0]])
    layer1 = torch.ones(4, 2)
    res = outlier_shares([layer0, layer1], factor=5.0)
    assert res["vectors"] == 16
    assert res["share"] == pytest.approx(1 / 16)
    assert res["per_layer"] == pytest.approx([1 / 8, 0.0])
    assert res["max_ratio_to_median"] == pytest.approx(10.0)


class _ChatTok:
    """Just enough of a tokenizer for fidelity_sequences: a chat template of fixed ids."""

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        return [1, len(messages[0]["content"]) % 100, 2]


def test_fidelity_sequences_pair_prompts_with_their_references(tmp_path: Path) -> None:
    refs = [[5, 6, 7], [8, 9]]
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"references": {"greedy": {"tokens": refs}}}))
    seqs = fidelity_sequences(_ChatTok(), results)
    assert [answer for _, answer in seqs] == refs
    assert all(prompt[0] == 1 and prompt[-1] == 2 for prompt, _ in seqs)
