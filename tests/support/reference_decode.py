"""A standalone decode loop: HF transformers Qwen3 weights + our torch reference policy.

It is the oracle for the SGLang integration. It keeps the prompt's K/V whole and each
layer's generated K/V in a dense per-head region ``[kv_heads, n, head_dim]``. When the
region holds budget + recent tokens at the start of a step, it runs one round with the
same policy, seed and round index as the server, and keeps each head's chosen tokens in
the chosen order. RoPE uses logical positions; attention reads only what is kept.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

from vase_sglang.config import PolicyConfig
from vase_sglang.kernels import ops
from vase_sglang.policies import Regions, carried_scores, make_policy


class ReferenceDecoder:
    def __init__(self, model, cfg: PolicyConfig | None = None, seed: int | None = None, backend: str = "torch"):
        self.model = model.eval()
        self.cfg = cfg if cfg is not None and cfg.evicts else None
        self.backend = backend  # the policy's kernels: "triton" replays a server that ran the Triton kernels
        self.policy = make_policy(self.cfg, backend=backend) if self.cfg else None
        self.seed = seed if seed is not None else 0
        mc = model.config
        self.n_layers = mc.num_hidden_layers
        self.hq, self.hkv = mc.num_attention_heads, mc.num_key_value_heads
        self.head_dim = getattr(mc, "head_dim", mc.hidden_size // mc.num_attention_heads)
        self.rounds = 0
        self.position = 0
        # A stateful policy's carried scores [1, layers, Hkv, B + R], as the server's.
        self.state: torch.Tensor | None = None

    @torch.no_grad()
    def _qkv(self, layer, h: torch.Tensor, positions: torch.Tensor):
        attn = layer.self_attn
        t = h.shape[0]
        q = attn.q_norm(attn.q_proj(h).view(t, self.hq, self.head_dim)).transpose(0, 1)[None]
        k = attn.k_norm(attn.k_proj(h).view(t, self.hkv, self.head_dim)).transpose(0, 1)[None]
        v = attn.v_proj(h).view(t, self.hkv, self.head_dim).transpose(0, 1)[None]
        cos, sin = self.model.model.rotary_emb(v, positions[None])
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return q[0], k[0], v[0]  # [heads, t, D]

    @torch.no_grad()
    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, causal: bool) -> torch.Tensor:
        m = self.model.model
        h = m.embed_tokens(ids)
        for li, layer in enumerate(m.layers):
            x = layer.input_layernorm(h)
            q, k, v = self._qkv(layer, x, positions)
            if causal:
                self.prompt_k[li], self.prompt_v[li] = k, v
                self.window_q[li] = q[:, -self._window :]  # the server records a prefill's last R queries
                keys, values = k, v
            else:
                self.region_k[li] = torch.cat([self.region_k[li], k], dim=1)
                self.region_v[li] = torch.cat([self.region_v[li], v], dim=1)
                self.window_q[li] = torch.cat([self.window_q[li], q], dim=1)[:, -self._window :]
                keys = torch.cat([self.prompt_k[li], self.region_k[li]], dim=1)
                values = torch.cat([self.prompt_v[li], self.region_v[li]], dim=1)
            out = F.scaled_dot_product_attention(q[None], keys[None], values[None], is_causal=causal, enable_gqa=True)
            out = out[0].transpose(0, 1).reshape(ids.shape[0], -1)
            h = h + layer.self_attn.o_proj(out)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.model.lm_head(m.norm(h)).float()

    @torch.no_grad()
    def prefill(self, prompt_ids: list[int]) -> torch.Tensor:
        """Logits ``[vocab]`` after the prompt."""
        n = self.n_layers
        empty = torch.zeros((self.hkv, 0, self.head_dim))
        self.prompt_k, self.prompt_v = [empty] * n, [empty] * n  # set by the causal forward below
        self.region_k, self.region_v = [empty] * n, [empty] * n
        self._window = self.cfg.recent if self.cfg else 1
        self.window_q = [torch.zeros((self.hq, 0, self.head_dim))] * n
        if self.policy is not None and self.policy.stateful:  # a new region: nothing scored yet
            self.state = torch.zeros((1, n, self.hkv, self.policy.config.region_size))
        ids = torch.tensor(prompt_ids)
        self.position = len(prompt_ids)
        return self._forward(ids, torch.arange(len(prompt_ids)), causal=True)[-1]

    @torch.no_grad()
    def reprefill(self, prompt_ids: list[int], generated_ids: list[int]) -> torch.Tensor:
        """What the server does after a retraction: recompute prompt + every generated
        token causally; the generated part becomes the region (G tokens, exact) and the
        window holds the prefill's last R queries, so a round runs at the next step when
        G >= B + R, keeping B of G. Rounds go on counting."""
        logits = self.prefill(prompt_ids + generated_ids)
        p = len(prompt_ids)
        for li in range(self.n_layers):
            self.region_k[li], self.prompt_k[li] = self.prompt_k[li][:, p:], self.prompt_k[li][:, :p]
            self.region_v[li], self.prompt_v[li] = self.prompt_v[li][:, p:], self.prompt_v[li][:, :p]
        return logits

    def _maybe_evict(self) -> None:
        cfg, policy = self.cfg, self.policy
        if cfg is None or policy is None or self.region_k[0].shape[1] < cfg.region_size:
            return
        keys = torch.stack(self.region_k)[None]  # [1, layers, H, L, D]
        values = torch.stack(self.region_v)[None]
        queries = torch.stack(self.window_q)[None]
        regions = Regions.from_dense(keys, values, queries, seeds=[self.seed], rounds=[self.rounds])
        if self.state is not None:
            regions.state = carried_scores(self.state, torch.tensor([0]), regions.n_candidates(cfg.recent))
        selection = policy.selection(regions)
        keep = selection.keep[0]  # [layers, H, B]
        if self.state is not None:
            assert selection.carry is not None, "a stateful policy's selection carries its scores"
            ops.carry_scores(self.state, torch.tensor([0]), selection.carry, selection.keep, backend=self.backend)
        idx = keep[..., None].expand(-1, -1, -1, self.head_dim)
        kept_k = torch.gather(keys[0], 2, idx)
        kept_v = torch.gather(values[0], 2, idx)
        self.region_k = list(kept_k.unbind(0))
        self.region_v = list(kept_v.unbind(0))
        self.rounds += 1

    @torch.no_grad()
    def step(self, token_id: int) -> torch.Tensor:
        """Feed one generated token; logits ``[vocab]`` for the next one."""
        self._maybe_evict()
        logits = self._forward(torch.tensor([token_id]), torch.tensor([self.position]), causal=False)[-1]
        self.position += 1
        return logits

    @property
    def region_length(self) -> int:
        return self.region_k[0].shape[1]
