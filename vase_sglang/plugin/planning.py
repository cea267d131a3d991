"""Planning: which policies a server's requests can reach, and what the eviction path
allocates for them beside the KV pool.

Pure arithmetic over ``PolicyConfig`` and the policy registry (no SGLang; torch only
through the policies' own workspace sizing). Everything that sizes or pre-compiles for the
reachable policies reads it: the memory reservation before the pool exists
(``patches/memory.py``), the scheduler's buffers, the warm-up and the offline compile
check (``vase_sglang.compile_check``).

Reachable: a request picks its policy (``kv_policy``) or ``auto`` picks one for its
budget; the query-reading policies are reachable only on a server that records queries.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import PolicyConfig
from ..policies import RoundShape, make_policy
from ..registry import EVICTING, REGISTRY
from ..sharding import HeadShard
from .auto import AutoTable

# Regions per kernel launch: bounds a round's temporaries (reserved before the pool is
# sized) whatever the number of requests whose regions fill in the same step.
MAX_ROUND_BATCH = 32


def captures_queries(server: PolicyConfig, auto: AutoTable | None = None, telemetry: bool = False) -> bool:
    """The server records queries: its policy reads them, ``auto`` may choose one that does,
    or the telemetry measures an evicting policy's rounds (it reads the window queries)."""
    if REGISTRY[server.policy].reads_queries or (telemetry and server.evicts):
        return True
    return auto is not None and any(REGISTRY[c["policy"]].reads_queries for c in auto.policies())


def reachable_policies(server: PolicyConfig, auto: AutoTable | None = None, telemetry: bool = False) -> list[str]:
    """Evicting policies a request may run on this server (its own ``kv_policy``, or
    ``auto``'s choice, which makes the server capture queries if it needs them): the ones
    that read queries only when the server captures them."""
    if not server.evicts:
        return []
    captures = captures_queries(server, auto, telemetry)
    return [name for name in EVICTING if captures or not REGISTRY[name].reads_queries]


def keeps_state(server: PolicyConfig, auto: AutoTable | None = None, telemetry: bool = False) -> bool:
    """The server keeps a score state per request row: a policy a request may run carries
    scores across rounds (H2O, G-KV)."""
    return any(REGISTRY[name].stateful for name in reachable_policies(server, auto, telemetry))


def reachable_configs(server_cfg: PolicyConfig, auto: AutoTable | None = None,
                      measure: bool = False) -> list[PolicyConfig]:
    """Configs a request may run at the server's budget: every policy it may pick, and
    ``auto``'s choices (which may also set ``outlier_factor``)."""
    out = [server_cfg.replace(policy=name) for name in reachable_policies(server_cfg, auto, measure)]
    if auto is not None:
        out += [server_cfg.replace(**c) for c in auto.policies()]
    return out


def warmup_configs(server_cfg: PolicyConfig, auto: AutoTable | None = None,
                   measure: bool = False) -> list[PolicyConfig]:
    """One config per kernel variant a request can reach: every policy it may pick, with
    and without the value reservation, at one budget per power-of-two block of candidates
    (the only budget-dependent compile-time constant; the budget itself is a runtime value)."""
    budgets: dict[int, int] = {}
    for b in range(2 * server_cfg.recent, server_cfg.budget + 1, server_cfg.recent):
        budgets.setdefault(1 << (b - 1).bit_length(), b)
    out = []
    for reachable in reachable_configs(server_cfg, auto, measure):
        for b in budgets.values():
            cfg = reachable.replace(budget=b)
            if cfg not in out:
                out.append(cfg)
            if cfg.large and cfg.replace(n_large=0) not in out:
                out.append(cfg.replace(n_large=0))
    return out


def select_block_limit(server_cfg: PolicyConfig) -> int | None:
    """The widest selection block the warm-up compiles (the largest budget's); a round over
    more candidates (the first after a long re-prefill) selects with the torch twin instead
    of compiling a kernel in the middle of a decode step."""
    return 1 << (server_cfg.budget - 1).bit_length() if server_cfg.evicts else None


def query_ring_bytes_per_request(cfg: PolicyConfig, n_layers: int, q_heads: int, head_dim: int,
                                 dtype_bytes: int, auto: AutoTable | None = None, measure: bool = False) -> int:
    """Bytes of query ring one request slot needs (0 when no reachable policy reads queries
    and the telemetry does not measure)."""
    if not captures_queries(cfg, auto, measure):
        return 0
    return n_layers * q_heads * cfg.recent * head_dim * dtype_bytes


def score_state_bytes_per_request(cfg: PolicyConfig, n_layers: int, kv_heads: int, auto: AutoTable | None = None,
                                  measure: bool = False) -> int:
    """Bytes of score state one request slot needs: one fp32 per (layer, KV head, region
    position) when a policy a request may run is stateful, else 0."""
    if not keeps_state(cfg, auto, measure):
        return 0
    return 4 * n_layers * kv_heads * cfg.region_size


def round_workspace_bytes(server_cfg: PolicyConfig, shape: RoundShape, auto: AutoTable | None = None,
                          measure: bool = False) -> int:
    """Peak temporaries of one batched round of ``min(shape.n_req, MAX_ROUND_BATCH)``
    regions, for the most demanding config a request may reach (at the server's budget,
    the largest a request may ask for), measured by the telemetry or not."""
    shape = RoundShape(**{**shape.__dict__, "n_req": min(shape.n_req, MAX_ROUND_BATCH)})
    return max((make_policy(c).workspace_bytes(shape, measure) for c in reachable_configs(server_cfg, auto, measure)),
               default=0)


@dataclass(frozen=True)
class PolicyMemory:
    """What the eviction path allocates beside the KV pool on one TP rank: the query ring
    and the score state (one row each per request slot) and the temporaries of one
    batched round."""

    ring_bytes_per_request: int
    request_slots: int
    workspace_bytes: int
    state_bytes_per_request: int = 0

    @property
    def ring_bytes(self) -> int:
        return self.ring_bytes_per_request * self.request_slots

    @property
    def state_bytes(self) -> int:
        return self.state_bytes_per_request * self.request_slots

    @property
    def total_bytes(self) -> int:
        return self.ring_bytes + self.state_bytes + self.workspace_bytes


def policy_memory(server_cfg: PolicyConfig, shard: HeadShard, n_layers: int, head_dim: int, itemsize: int,
                  request_slots: int, auto: AutoTable | None = None, measure: bool = False) -> PolicyMemory:
    """The one sizing of the ring, the score state and the round workspace, for a rank
    holding ``shard``'s heads (the reservation before the pool exists and the start-up
    report both use it); ``measure``: the telemetry measures every round."""
    ring = query_ring_bytes_per_request(server_cfg, n_layers, shard.q_heads, head_dim, itemsize, auto, measure)
    shape = RoundShape(n_req=request_slots, n_layers=n_layers, q_heads=shard.q_heads, kv_heads=shard.kv_heads,
                       head_dim=head_dim, itemsize=itemsize, total_kv_heads=shard.total_kv_heads)
    state = score_state_bytes_per_request(server_cfg, n_layers, shard.kv_heads, auto, measure)
    return PolicyMemory(ring, request_slots, round_workspace_bytes(server_cfg, shape, auto, measure), state)
