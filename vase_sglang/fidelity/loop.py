"""A batched decode loop with KV eviction: HF weights, our torch policies, chunked teacher forcing.

It reproduces what the SGLang plugin does to one request, for a batch of requests at once:
the prompt's K/V is kept whole (it lives in SGLang's radix tree), each layer's generated
K/V lives in a per-head region, and when the region holds ``budget + recent`` tokens at
the start of a step, one round keeps ``budget`` of them per (layer, KV head) with the
policy, seed and round index the server would use. RoPE positions stay logical.

Why chunks are exact: a round can only fire when the region is full, which happens every
``recent`` fed tokens, and between rounds the kept set does not change. So feeding the
``recent`` tokens of a teacher sequence as one causal chunk computes the same K/V, queries
and logits as feeding them one by one; it just turns 32 matrix-vector products into one
matrix product. ``tests/tools/test_fidelity.py`` checks chunked against one-by-one.

Works for the dense decoders with standard attention: Llama (SmolLM2), Mistral without a
sliding window, Qwen2 / Qwen2.5 (q/k/v biases, e.g. DeepSeek-R1-Distill-Qwen) and Qwen3
(per-head q/k norms, the bundled model). ``check_supported`` names what another model lacks;
``tests/tools/test_fidelity.py`` checks each family against HF's own forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from vase_sglang.kernels import ops
from vase_sglang.policies import Policy, Regions, carried_scores

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def eos_ids(tok: Any, lm: Any) -> tuple[int, ...]:
    """The tokenizer's EOS and the generation config's (Qwen-style chat models have several)."""
    ids = {tok.eos_token_id}
    extra = getattr(getattr(lm, "generation_config", None), "eos_token_id", None)
    ids.update(extra if isinstance(extra, list) else [extra])
    return tuple(sorted(i for i in ids if i is not None))


class UnsupportedModel(ValueError):
    """A model the decode loop cannot reproduce; the message names what is missing."""


def check_supported_config(mc: Any) -> None:
    """Raise ``UnsupportedModel`` unless an HF config describes attention the loop computes."""
    kind = getattr(mc, "model_type", "?")
    if kind not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModel(f"model_type {kind!r} is not supported (supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    types = set(getattr(mc, "layer_types", None) or ["full_attention"])
    window = getattr(mc, "sliding_window", None)
    if types != {"full_attention"} or (window and getattr(mc, "use_sliding_window", kind == "mistral")):
        raise UnsupportedModel(f"{kind}: sliding-window attention (sliding_window={window}, layer_types "
                               f"{sorted(types)}); only full attention is supported")


def check_supported(model: torch.nn.Module) -> None:
    """Raise ``UnsupportedModel`` unless the loop computes exactly this model's attention."""
    check_supported_config(model.config)
    kind = getattr(model.config, "model_type", "?")
    inner: Any = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if inner is None or layers is None or not hasattr(inner, "rotary_emb") or not hasattr(model, "lm_head"):
        raise UnsupportedModel(f"{kind}: expected model.model.layers, model.model.rotary_emb and lm_head")
    attn = layers[0].self_attn
    missing = [n for n in ("q_proj", "k_proj", "v_proj", "o_proj") if not hasattr(attn, n)]
    if missing:
        raise UnsupportedModel(f"{kind}: attention has no {', '.join(missing)}")


@dataclass
class PromptCache:
    """Prefilled prompts of a batch: per layer ``[N, Hkv, P, D]`` K/V, right-padded to P."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    lengths: torch.Tensor  # [N] prompt lengths
    first_logits: torch.Tensor  # [N, V] logits of the first generated token

    @property
    def width(self) -> int:
        return self.keys[0].shape[2]

    @property
    def valid(self) -> torch.Tensor:
        """``[N, P]`` True where a prompt position exists."""
        return torch.arange(self.width, device=self.lengths.device)[None, :] < self.lengths[:, None]


@dataclass
class Arm:
    """One policy's KV state for the batch. ``policy=None`` is the full cache."""

    name: str
    policy: Policy | None
    seed: int
    capacity: int
    # Per-request noise seeds (the server seeds each request on its own); None: ``seed`` for all.
    row_seeds: list[int] | None = None
    keys: list[torch.Tensor] = field(default_factory=list)  # per layer [N, Hkv, P + capacity, D]
    values: list[torch.Tensor] = field(default_factory=list)
    window_q: list[torch.Tensor] = field(default_factory=list)  # per layer [N, Hq, <=R, D]
    region_len: int = 0
    fed: int = 0  # generated tokens fed so far (logical position offset)
    rounds: int = 0
    window: int = 0  # queries kept by a full-cache arm (for forking)
    # Measure each round's evicted attention, as a server with --kv-telemetry on does.
    measure: bool = False
    # Per round: (output tokens when it ran, [N] signal: mean over layers and KV heads).
    signals: list[tuple[int, list[float]]] = field(default_factory=list)
    # A stateful policy's carried scores, [N, layers, Hkv, capacity], as the server's score state.
    state: torch.Tensor | None = None

    @property
    def query_window(self) -> int:
        if self.policy is not None:
            return self.policy.config.recent if self.policy.needs_queries or self.measure else 0
        return self.window


class BatchedDecoder:
    """Runs arms over one prefilled batch; every arm sees the same prompt K/V."""

    def __init__(self, model: torch.nn.Module):
        # HF modules resolve their submodules (model.layers, self_attn.q_proj, ...) at run
        # time, so they are typed Any here rather than torch's Tensor | Module.
        self.model: Any = model.eval()
        mc: Any = model.config
        self.n_layers = mc.num_hidden_layers
        self.hq, self.hkv = mc.num_attention_heads, mc.num_key_value_heads
        self.head_dim = getattr(mc, "head_dim", None) or mc.hidden_size // mc.num_attention_heads
        self.device = next(model.parameters()).device
        self.prompt: PromptCache | None = None

    # ---- projections --------------------------------------------------------------
    def _qkv(self, layer: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """``x [N, T, hidden]`` -> post-RoPE q ``[N, Hq, T, D]``, k and v ``[N, Hkv, T, D]``."""
        attn = layer.self_attn
        n, t, _ = x.shape
        q = attn.q_proj(x).view(n, t, self.hq, self.head_dim)
        k = attn.k_proj(x).view(n, t, self.hkv, self.head_dim)
        v = attn.v_proj(x).view(n, t, self.hkv, self.head_dim)
        if hasattr(attn, "q_norm"):  # Qwen3 normalises each head before RoPE
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return q, k, v

    def _layer_out(self, layer: Any, h: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        n, _, t, _ = attn_out.shape
        h = h + layer.self_attn.o_proj(attn_out.transpose(1, 2).reshape(n, t, -1))
        return h + layer.mlp(layer.post_attention_layernorm(h))

    # ---- prefill ------------------------------------------------------------------
    @torch.no_grad()
    def prefill(self, prompts: list[list[int]]) -> PromptCache:
        """Prefill each prompt alone (causal), then pad the K/V into one batch."""
        m = self.model.model
        per_prompt = []
        first = []
        for ids in prompts:
            x = torch.tensor(ids, device=self.device)[None]
            pos = torch.arange(len(ids), device=self.device)[None]
            h = m.embed_tokens(x)
            cos, sin = m.rotary_emb(h, pos)
            ks, vs = [], []
            for layer in m.layers:
                q, k, v = self._qkv(layer, layer.input_layernorm(h), cos, sin)
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                ks.append(k[0])
                vs.append(v[0])
                h = self._layer_out(layer, h, out)
            first.append(self.model.lm_head(m.norm(h[:, -1])).float()[0])
            per_prompt.append((ks, vs))
        width = max(len(p) for p in prompts)
        n = len(prompts)
        keys, values = [], []
        for li in range(self.n_layers):
            kb = torch.zeros((n, self.hkv, width, self.head_dim), device=self.device)
            vb = torch.zeros_like(kb)
            for i, (ks, vs) in enumerate(per_prompt):
                kb[i, :, : ks[li].shape[1]] = ks[li]
                vb[i, :, : vs[li].shape[1]] = vs[li]
            keys.append(kb)
            values.append(vb)
        lengths = torch.tensor([len(p) for p in prompts], device=self.device)
        self.prompt = PromptCache(keys, values, lengths, torch.stack(first))
        return self.prompt

    # ---- arms ---------------------------------------------------------------------
    def new_arm(self, name: str, policy: Policy | None, seed: int = 0, max_tokens: int = 1024,
                window: int = 0, row_seeds: list[int] | None = None, measure: bool = False) -> Arm:
        """An arm whose buffers hold the prompt and room for its region (B + R, or every token).

        ``window``: a full-cache arm that also keeps its last ``window`` queries, so that
        evicting arms can be forked from it (``fork``). ``measure``: record each round's
        evicted attention in ``arm.signals``.
        """
        p = self._require_prompt()
        capacity = policy.config.region_size if policy is not None else max_tokens
        n = p.lengths.shape[0]
        if row_seeds is not None and len(row_seeds) != n:
            raise ValueError(f"{name}: {len(row_seeds)} row seeds for {n} requests")
        arm = Arm(name=name, policy=policy, seed=seed, capacity=capacity, window=window, row_seeds=row_seeds,
                  measure=measure and policy is not None)
        for li in range(self.n_layers):
            for src, dst in ((p.keys[li], arm.keys), (p.values[li], arm.values)):
                buf = torch.empty((n, self.hkv, p.width + capacity, self.head_dim), device=self.device)
                buf[:, :, : p.width] = src
                dst.append(buf)
            arm.window_q.append(torch.zeros((n, self.hq, 0, self.head_dim), device=self.device))
        if policy is not None and policy.stateful:
            arm.state = torch.zeros((n, self.n_layers, self.hkv, capacity), device=self.device)
        return arm

    def fork(self, source: Arm, arm: Arm) -> None:
        """Give ``arm`` the state of a full-cache ``source`` arm that has not evicted yet.

        Until its first round an evicting arm computes exactly what the full cache does,
        so the sweep runs that stretch once and forks every arm from it when the region is full.
        """
        if source.policy is not None or arm.region_len or arm.fed:
            raise ValueError("fork a fresh arm from a full-cache arm")
        if source.region_len > arm.capacity:
            raise ValueError(f"{arm.name}: cannot fork at region {source.region_len} > capacity {arm.capacity}")
        end = self._require_prompt().width + source.region_len
        for li in range(self.n_layers):
            arm.keys[li][:, :, :end] = source.keys[li][:, :, :end]
            arm.values[li][:, :, :end] = source.values[li][:, :, :end]
            if arm.query_window:
                if source.window < arm.query_window:
                    raise ValueError(f"{arm.name}: the source keeps {source.window} queries, {arm.query_window} needed")
                arm.window_q[li] = source.window_q[li][:, :, -arm.query_window :].clone()
        arm.region_len, arm.fed = source.region_len, source.fed

    def _require_prompt(self) -> PromptCache:
        if self.prompt is None:
            raise RuntimeError("prefill() first")
        return self.prompt

    def _evict(self, arm: Arm) -> None:
        """One round: keep ``budget`` of the ``budget + recent`` region positions per (layer, head)."""
        policy = arm.policy
        assert policy is not None
        p0, length = self._require_prompt().width, arm.region_len
        keys = torch.stack([k[:, :, p0 : p0 + length] for k in arm.keys], dim=1)  # [N, layers, H, L, D]
        values = torch.stack([v[:, :, p0 : p0 + length] for v in arm.values], dim=1)
        queries = torch.stack(arm.window_q, dim=1) if arm.query_window else None
        n = keys.shape[0]
        seeds = arm.row_seeds if arm.row_seeds is not None else [arm.seed] * n
        regions = Regions.from_dense(keys, values, queries, seeds=seeds, rounds=[arm.rounds] * n)
        if arm.state is not None:
            regions.state = carried_scores(arm.state, torch.arange(n, device=self.device),
                                           regions.n_candidates(policy.config.recent))
        selection = policy.selection(regions, measure=arm.measure)
        keep = selection.keep  # [N, layers, H, B]
        if arm.state is not None and selection.carry is not None:
            ops.carry_scores(arm.state, torch.arange(n, device=self.device), selection.carry, keep,
                             backend=policy.backend)
        if selection.evicted_attention is not None:
            # The round runs before output token fed + 1 is fed: the server's len(output_ids).
            arm.signals.append((arm.fed + 1, selection.evicted_attention.mean(dim=(1, 2)).tolist()))
        idx = keep[..., None].expand(-1, -1, -1, -1, self.head_dim)
        kept_k, kept_v = torch.gather(keys, 3, idx), torch.gather(values, 3, idx)
        b = keep.shape[-1]
        for li in range(self.n_layers):
            arm.keys[li][:, :, p0 : p0 + b] = kept_k[:, li]
            arm.values[li][:, :, p0 : p0 + b] = kept_v[:, li]
        arm.region_len = b
        arm.rounds += 1

    @torch.no_grad()
    def feed(self, arm: Arm, tokens: torch.Tensor) -> torch.Tensor:
        """Feed ``tokens [N, T]`` (generated tokens, in order); returns logits ``[N, T, V]``.

        A round runs first when the region is full, as the server does before a decode step.
        The chunk must not cross a round boundary (``T <= recent`` and aligned to it).
        """
        prompt = self._require_prompt()
        policy = arm.policy
        if policy is not None and arm.region_len >= policy.config.region_size:
            self._evict(arm)
        n, t = tokens.shape
        if arm.region_len + t > arm.capacity:
            raise ValueError(f"{arm.name}: chunk of {t} overflows the region ({arm.region_len}/{arm.capacity}); "
                             "chunks must be aligned to `recent`")
        m = self.model.model
        positions = prompt.lengths[:, None] + arm.fed + torch.arange(t, device=self.device)[None, :]
        h = m.embed_tokens(tokens)
        cos, sin = m.rotary_emb(h, positions)
        start = prompt.width + arm.region_len
        end = start + t
        causal = torch.ones((t, t), dtype=torch.bool, device=self.device).tril()
        mask = torch.cat([
            prompt.valid[:, None, :].expand(n, t, -1),
            torch.ones((n, t, arm.region_len), dtype=torch.bool, device=self.device),
            causal[None].expand(n, -1, -1),
        ], dim=-1)[:, None]  # [N, 1, T, P + L + T]
        window = arm.query_window
        for li, layer in enumerate(m.layers):
            q, k, v = self._qkv(layer, layer.input_layernorm(h), cos, sin)
            arm.keys[li][:, :, start:end] = k
            arm.values[li][:, :, start:end] = v
            if window:
                arm.window_q[li] = torch.cat([arm.window_q[li], q], dim=2)[:, :, -window:]
            out = F.scaled_dot_product_attention(q, arm.keys[li][:, :, :end], arm.values[li][:, :, :end],
                                                 attn_mask=mask, enable_gqa=True)
            h = self._layer_out(layer, h, out)
        arm.region_len += t
        arm.fed += t
        return self.model.lm_head(m.norm(h)).float()


@torch.no_grad()
def generate(decoder: BatchedDecoder, arm: Arm, n_tokens: int, temperature: float = 0.0,
             min_tokens: int = 0, eos_ids: tuple[int, ...] = (), seed: int = 0,
             stops: list[int | None] | None = None) -> torch.Tensor:
    """Free-running decode of ``n_tokens`` per request, one token per step: ``[N, n_tokens]``.

    Greedy when ``temperature == 0``, else sampled at that temperature with a seeded
    generator. EOS is masked for the first ``min_tokens`` tokens (SGLang's ``min_new_tokens``).
    ``stops``, when given, receives per request the first step whose top-1 token was an EOS
    (where an unmasked greedy run would have stopped), or None.
    """
    gen = torch.Generator().manual_seed(seed)
    logits = decoder._require_prompt().first_logits.clone()
    n = logits.shape[0]
    first_stop: list[int | None] = [None] * n
    out = []
    for step in range(n_tokens):
        if eos_ids:
            top = logits.argmax(-1).tolist()
            for i, t in enumerate(top):
                if first_stop[i] is None and t in eos_ids:
                    first_stop[i] = step
        if step < min_tokens and eos_ids:
            logits[:, list(eos_ids)] = float("-inf")
        if temperature == 0:
            tok = logits.argmax(-1)
        else:
            tok = torch.multinomial((logits / temperature).softmax(-1), 1, generator=gen)[:, 0]
        out.append(tok)
        if step + 1 < n_tokens:
            logits = decoder.feed(arm, tok[:, None])[:, -1]
    if stops is not None:
        stops[:] = first_stop
    return torch.stack(out, dim=1)


@torch.no_grad()
def sample_teacher(decoder: BatchedDecoder, max_tokens: int, eos_ids: tuple[int, ...], temperature: float,
                   top_p: float = 1.0, seed: int = 0, on_step: Any = None) -> tuple[torch.Tensor, list[int]]:
    """Full-cache continuations of the prefilled requests, each up to its natural end.

    Sampled with ``temperature`` and ``top_p`` (greedy when ``temperature == 0``), one
    token per step, until every request has produced an EOS or ``max_tokens``. Returns
    tokens ``[N, T]`` (after a request's EOS, EOS again: padding that is fed but not scored)
    and each request's length, its EOS included.
    """
    from transformers.generation.logits_process import LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper

    warpers = LogitsProcessorList()
    if temperature > 0:
        warpers.append(TemperatureLogitsWarper(temperature))
        if top_p < 1.0:
            warpers.append(TopPLogitsWarper(top_p))
    gen = torch.Generator(device=decoder.device).manual_seed(seed)
    arm = decoder.new_arm("teacher", None, max_tokens=max_tokens)
    logits = decoder._require_prompt().first_logits.clone()
    n = logits.shape[0]
    pad = eos_ids[0] if eos_ids else 0
    ends: list[int | None] = [None] * n
    out: list[torch.Tensor] = []
    for step in range(max_tokens):
        if temperature == 0:
            tok = logits.argmax(-1)
        else:
            no_ids = cast(torch.LongTensor, torch.empty((n, 0), dtype=torch.long, device=decoder.device))
            probs = warpers(no_ids, cast(torch.FloatTensor, logits)).softmax(-1)
            tok = torch.multinomial(probs, 1, generator=gen)[:, 0]
        for i, t in enumerate(tok.tolist()):
            if ends[i] is not None:
                tok[i] = pad
            elif t in eos_ids:
                ends[i] = step + 1
        out.append(tok)
        if on_step is not None:
            on_step()
        if all(e is not None for e in ends):
            break
        if step + 1 < max_tokens:
            logits = decoder.feed(arm, tok[:, None])[:, -1]
    return torch.stack(out, dim=1), [e if e is not None else max_tokens for e in ends]
