"""The DSPARK draft network in plain PyTorch, computing what sglang's DSparkDraftModel computes.

Context: the target's hidden states at `target_layer_ids`, concatenated per position, go through
`ctx = hidden_norm(fc(features))`; every draft layer turns `ctx` into its context K/V directly (k = k_norm(k_proj(ctx))
with RoPE at the context position, v = v_proj(ctx); no input norm), as sglang's `write_target_hidden_kv` does.

Block: the tokens [anchor, mask, ..., mask] (block_size of them, embedded by the target) at positions
anchor_pos .. anchor_pos + block_size - 1 run through Qwen3-style pre-norm layers (q/k RMSNorm per head, neox RoPE,
SiLU MLP). Each block row attends to every context position before the anchor and to every row of its own block
(no causal mask inside the block: sglang's draft attention is ENCODER_ONLY). The final norm, then the target's LM head,
give the base logits of row j, which proposes the token at anchor_pos + 1 + j.

Markov head: step j's logits are base_j + markov_w2(markov_w1[prev_j]), prev_0 = the anchor, prev_j = the token chosen
at step j - 1 (teacher-forced in training).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import DSparkConfig


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos, sin of shape positions.shape + (head_dim,) for neox-style (rotate-half) RoPE."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    freqs = positions.to(torch.float32)[..., None] * inv
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (..., heads, T, head_dim); cos/sin: (..., T, head_dim), broadcast over heads."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.unsqueeze(-3) + rotated * sin.unsqueeze(-3)


class Attention(nn.Module):
    def __init__(self, cfg: DSparkConfig):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.q_proj = nn.Linear(h, self.heads * d, bias=False)
        self.k_proj = nn.Linear(h, self.kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, self.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.heads * d, h, bias=False)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def _split(self, x: torch.Tensor, heads: int) -> torch.Tensor:  # (B, T, heads*d) -> (B, heads, T, d)
        return x.view(*x.shape[:-1], heads, self.head_dim).transpose(-3, -2)

    def kv(self, x: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """K (normed, roped) and V of `x` (B, T, H): each (B, kv_heads, T, head_dim)."""
        k = apply_rope(self.k_norm(self._split(self.k_proj(x), self.kv_heads)), cos, sin)
        return k, self._split(self.v_proj(x), self.kv_heads)

    def forward(self, x, cos, sin, context_kv, mask) -> torch.Tensor:
        """x: (B, Q, H) block rows; context_kv: (K, V) each (B, kv_heads, C, d); mask: bool (B, Q, C + Q), True =
        visible."""
        q = apply_rope(self.q_norm(self._split(self.q_proj(x), self.heads)), cos, sin)
        k, v = self.kv(x, cos, sin)
        ck, cv = context_kv
        k = torch.cat([ck.to(k.dtype), k], dim=-2)
        v = torch.cat([cv.to(v.dtype), v], dim=-2)
        group = self.heads // self.kv_heads
        if group > 1:
            k = k.repeat_interleave(group, dim=-3)
            v = v.repeat_interleave(group, dim=-3)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.unsqueeze(-3))
        return self.o_proj(out.transpose(-3, -2).reshape(*x.shape[:-1], self.heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, cfg: DSparkConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, cfg: DSparkConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, context_kv, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, context_kv, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class MarkovHead(nn.Module):
    """sglang's VanillaMarkov: bias(prev) = markov_w2(markov_w1(prev)), markov_w1 an Embedding(V, R), markov_w2 a
    Linear(R, V) without bias (weight (V, R))."""

    def __init__(self, vocab_size: int, rank: int):
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, vocab_size, bias=False)

    def forward(self, prev_tokens: torch.Tensor) -> torch.Tensor:
        return self.markov_w2(self.markov_w1(prev_tokens))


class DSparkDraftModel(nn.Module):
    """Parameter names are sglang's checkpoint names (`layers.N.self_attn.q_proj.weight`, `fc.weight`, ...)."""

    def __init__(self, cfg: DSparkConfig):
        super().__init__()
        self.config = cfg
        self.layers = nn.ModuleList([Layer(cfg) for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.fc = nn.Linear(cfg.context_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.markov_head = MarkovHead(cfg.vocab_size, cfg.markov_rank)

    def init_weights(self, generator: torch.Generator | None = None, std: float = 0.02) -> None:
        """Normal(0, std) linears and Markov w1, ones for norms, zeros for markov_w2 (the bias starts at 0)."""
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                elif name == "markov_head.markov_w2.weight":
                    p.zero_()
                else:
                    p.copy_(torch.randn(p.shape, generator=generator) * std)

    # ---- context ----------------------------------------------------------------------------------------------------

    def project_context(self, features: torch.Tensor) -> torch.Tensor:
        """(..., len(target_layer_ids) * H) concatenated target hidden states -> (..., H)."""
        return self.hidden_norm(self.fc(features.to(self.fc.weight.dtype)))

    def context_kv(self, ctx: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (K, V) of the projected context ctx (B, C, H) at positions (B, C): each (B, kv_heads, C, d)."""
        cos, sin = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, ctx.dtype)
        return [layer.self_attn.kv(ctx, cos, sin) for layer in self.layers]

    # ---- block ------------------------------------------------------------------------------------------------------

    def block_hidden(self, embeds, positions, context_kv, mask) -> torch.Tensor:
        """Final-normed hidden states of block rows embeds (B, Q, H) at positions (B, Q), attending to context_kv
        (per layer) and each other under mask (B, Q, C + Q)."""
        cos, sin = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, embeds.dtype)
        x = embeds
        for layer, kv in zip(self.layers, context_kv):
            x = layer(x, cos, sin, kv, mask)
        return self.norm(x)

    def markov_bias(self, prev_tokens: torch.Tensor) -> torch.Tensor:
        return self.markov_head(prev_tokens)


def block_ids(anchors: torch.Tensor, block_size: int, mask_token_id: int) -> torch.Tensor:
    """(..., block_size) block token ids: the anchor, then the mask token."""
    ids = anchors.new_full((*anchors.shape, block_size), mask_token_id)
    ids[..., 0] = anchors
    return ids
