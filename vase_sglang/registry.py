"""The policy registry: what every tool knows about a policy, in one place, without torch.

Each entry describes one policy the server accepts (``--kv-policy`` and ``kv_policy``).
Everything that lists policies derives its list from here: the config's validation, the
policy classes' flags (``vase_sglang.policies``), the per-request error messages, the query
ring and state sizing, the fidelity sweep, ``calibrate``, ``eval`` and the fuzz. Adding a
policy is one class in ``policies.py``, one ``PolicySpec`` below and its tests
(docs/adding-a-policy.md); ``tests/unit/test_registry.py`` fails when a list anywhere
names a policy this registry does not know, or misses one it does.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PolicySpec:
    """One policy, as the tools see it."""

    name: str
    summary: str  # one line, for --help and the docs' policy table
    evicts: bool = True
    # Scores with the attention of the last R queries (the server keeps a query ring for it).
    reads_queries: bool = False
    # Draws Exp(1) noise at every round to sample without replacement.
    draws_noise: bool = False
    # Its choice varies with the per-request seed from round to round (noise or a sketch
    # drawn anew): calibrate and the sweep run it with every seed they are given.
    stochastic: bool = False
    # Keeps one float per (layer, KV head, region position) across rounds, moved with the
    # tokens when a round compacts the region (the server's score state).
    stateful: bool = False


_SPECS = (
    PolicySpec("none", "the full cache; never evicts", evicts=False),
    PolicySpec("vase", "VaSE-AttnV: the B/4 largest value ranges, then sampled by window attention",
               reads_queries=True, draws_noise=True, stochastic=True),
    PolicySpec("vase-dkv", "VaSE-DKV: CUR leverage with a Gaussian sketch drawn anew every round", stochastic=True),
    PolicySpec("snapkv", "SnapKV: top-k of the pooled window attention", reads_queries=True),
    PolicySpec("rkv", "R-KV: window attention minus key redundancy, top-k", reads_queries=True),
    PolicySpec("curdkv", "CurDKV: CUR leverage with one sketch per request and layer"),
    PolicySpec("streamingllm", "StreamingLLM: the sinks and the newest tokens"),
    PolicySpec("random", "uniform sampling without replacement", draws_noise=True, stochastic=True),
    PolicySpec("h2o", "H2O: heavy hitters by window attention accumulated over every round",
               reads_queries=True, stateful=True),
    PolicySpec("gkv", "G-KV: max(decayed global score, local attention) minus key redundancy, top-k",
               reads_queries=True, stateful=True),
    PolicySpec("tova", "TOVA: top-k of the newest query's attention, averaged over the GQA group",
               reads_queries=True),
)

REGISTRY: dict[str, PolicySpec] = {spec.name: spec for spec in _SPECS}

# Ablation-only policies (the fidelity sweep's pilot): never served.
PILOT_REGISTRY: dict[str, PolicySpec] = {
    "evict-large": PolicySpec("evict-large", "pilot control: keeps the smallest value ranges (paper section 5.1)"),
}

POLICY_NAMES: tuple[str, ...] = tuple(REGISTRY)
EVICTING: tuple[str, ...] = tuple(name for name, spec in REGISTRY.items() if spec.evicts)
STOCHASTIC: tuple[str, ...] = tuple(name for name, spec in REGISTRY.items() if spec.stochastic)
QUERY_FREE: tuple[str, ...] = tuple(name for name, spec in REGISTRY.items() if not spec.reads_queries)


def spec(name: str) -> PolicySpec:
    """The registered policy (served or pilot) called ``name``."""
    found = REGISTRY.get(name) or PILOT_REGISTRY.get(name)
    if found is None:
        raise KeyError(f"unknown policy {name!r}; registered: {', '.join(POLICY_NAMES)}")
    return found
