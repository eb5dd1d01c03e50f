"""A trainable Qwen3 DSpark drafter (``torch.nn.Module``) with DeepSpec tensor names.

The math is the same as :class:`dspark.TorchDrafter` (it reuses :mod:`dspark.reference.torch_ops`):
``ctx = hidden_norm(fc(features))``; every layer's context keys/values come from ``ctx``
(``k_norm`` + RoPE on keys, no ``input_layernorm``); block queries/keys/values come from the
pre-normed block; final ``norm``; ``lm_head``; Markov bias ``W2 W1[x_{k-1}]``; confidence logit
``proj([h_k ; W1[x_{k-1}]])``. In training one pass runs many blocks per sequence: a block query
sees the context positions before its anchor and its whole block (non-causal inside the block),
as in DeepSpec's training mask. ``state_dict()`` keys are the DeepSpec checkpoint names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from dspark.reference.torch_ops import Rope, mlp, rms_norm

__all__ = ["DrafterShape", "TrainableDrafter"]


@dataclass(frozen=True)
class DrafterShape:
    """Hyper-parameters of the drafter (DeepSpec ``Qwen3DSparkModel`` config fields)."""

    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_layers: int
    target_hidden_size: int
    num_target_layers: int
    target_layer_ids: tuple[int, ...]
    vocab_size: int  # V_in = V_d (padded above the target's logical vocabulary)
    target_vocab_size: int
    block_size: int
    mask_token_id: int
    markov_rank: int
    rope_theta: float = 10000.0
    eps: float = 1e-6


class _Norm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))


class _Attention(nn.Module):
    def __init__(self, s: DrafterShape) -> None:
        super().__init__()
        h, d = s.hidden_size, s.head_dim
        self.q_proj = nn.Linear(h, s.num_heads * d, bias=False)
        self.k_proj = nn.Linear(h, s.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, s.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(s.num_heads * d, h, bias=False)
        self.q_norm = _Norm(d)
        self.k_norm = _Norm(d)


class _Mlp(nn.Module):
    def __init__(self, s: DrafterShape) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(s.hidden_size, s.intermediate_size, bias=False)
        self.up_proj = nn.Linear(s.hidden_size, s.intermediate_size, bias=False)
        self.down_proj = nn.Linear(s.intermediate_size, s.hidden_size, bias=False)


class _Layer(nn.Module):
    def __init__(self, s: DrafterShape) -> None:
        super().__init__()
        self.self_attn = _Attention(s)
        self.mlp = _Mlp(s)
        self.input_layernorm = _Norm(s.hidden_size)
        self.post_attention_layernorm = _Norm(s.hidden_size)


class _Markov(nn.Module):
    def __init__(self, s: DrafterShape) -> None:
        super().__init__()
        self.markov_w1 = nn.Embedding(s.vocab_size, s.markov_rank)
        self.markov_w2 = nn.Linear(s.markov_rank, s.vocab_size, bias=False)


class _Confidence(nn.Module):
    def __init__(self, s: DrafterShape) -> None:
        super().__init__()
        self.proj = nn.Linear(s.hidden_size + s.markov_rank, 1)


class TrainableDrafter(nn.Module):
    """The drafter; see the module docstring. Parameter names = DeepSpec tensor names."""

    def __init__(self, s: DrafterShape) -> None:
        """Random init (``std 0.02`` linears, zero Markov W2, as a neutral Markov start)."""
        super().__init__()
        self.shape = s
        width = len(s.target_layer_ids) * s.target_hidden_size
        self.fc = nn.Linear(width, s.hidden_size, bias=False)
        self.hidden_norm = _Norm(s.hidden_size)
        self.layers = nn.ModuleList(_Layer(s) for _ in range(s.num_layers))
        self.norm = _Norm(s.hidden_size)
        self.embed_tokens = nn.Embedding(s.vocab_size, s.hidden_size)
        self.lm_head = nn.Linear(s.hidden_size, s.vocab_size, bias=False)
        self.markov_head = _Markov(s)
        self.confidence_head = _Confidence(s)
        self.rope = Rope(head_dim=s.head_dim, theta=s.rope_theta)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, std=0.02)
        nn.init.zeros_(self.markov_head.markov_w2.weight)

    def context(self, features: torch.Tensor) -> torch.Tensor:
        """``hidden_norm(fc(features))`` for ``features [B, T, L*H_t]``."""
        return rms_norm(self.fc(features), self.hidden_norm.weight, self.shape.eps)

    def _heads(self, x: torch.Tensor, proj: nn.Linear, n: int) -> torch.Tensor:
        return proj(x).view(*x.shape[:-1], n, self.shape.head_dim)

    def backbone(
        self,
        features: torch.Tensor,
        block_ids: torch.Tensor,
        block_pos: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """Hidden states (post final norm) of all block slots.

        ``features [B,T,L*H_t]`` at positions ``0..T-1``; ``block_ids, block_pos [B,Q]`` (all
        blocks of a sequence flattened); ``mask [B,Q,T+Q]`` (True = attend) over context keys then
        block keys. Returns ``[B, Q, H]``.
        """
        s = self.shape
        ctx = self.context(features)
        b, t = ctx.shape[:2]
        ctx_pos = torch.arange(t).expand(b, t)
        h = self.embed_tokens(block_ids)
        bias = torch.zeros(mask.shape, dtype=h.dtype).masked_fill(~mask, float("-inf"))[:, None]
        for layer in self.layers:
            att = layer.self_attn
            k_ctx = self.rope.apply(
                rms_norm(self._heads(ctx, att.k_proj, s.num_kv_heads), att.k_norm.weight, s.eps),
                ctx_pos,
            )
            v_ctx = self._heads(ctx, att.v_proj, s.num_kv_heads)
            x = rms_norm(h, layer.input_layernorm.weight, s.eps)
            q = self.rope.apply(
                rms_norm(self._heads(x, att.q_proj, s.num_heads), att.q_norm.weight, s.eps),
                block_pos,
            )
            k = self.rope.apply(
                rms_norm(self._heads(x, att.k_proj, s.num_kv_heads), att.k_norm.weight, s.eps),
                block_pos,
            )
            v = self._heads(x, att.v_proj, s.num_kv_heads)
            keys = torch.cat([k_ctx, k], 1).transpose(1, 2)  # [B, KVH, S, D]
            vals = torch.cat([v_ctx, v], 1).transpose(1, 2)
            groups = s.num_heads // s.num_kv_heads
            keys = keys.repeat_interleave(groups, dim=1)
            vals = vals.repeat_interleave(groups, dim=1)
            out = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), keys, vals, attn_mask=bias, scale=1.0 / math.sqrt(s.head_dim)
            )
            h = h + att.o_proj(out.transpose(1, 2).reshape(b, -1, s.num_heads * s.head_dim))
            x = rms_norm(h, layer.post_attention_layernorm.weight, s.eps)
            h = h + mlp(
                x, layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight, layer.mlp.down_proj.weight
            )
        return rms_norm(h, self.norm.weight, s.eps)

    def heads(
        self, hidden: torch.Tensor, prev_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(Markov-corrected logits with padded rows at ``-inf``, confidence logits).

        ``hidden [..., H]``, ``prev_ids [...]`` the token before each slot (teacher forcing).
        """
        e = self.markov_head.markov_w1(prev_ids)
        logits = self.lm_head(hidden) + self.markov_head.markov_w2(e)
        logits = logits.masked_fill(self.padded_rows(), float("-inf"))
        conf = self.confidence_head.proj(torch.cat([hidden, e], dim=-1)).squeeze(-1)
        return logits, conf

    def padded_rows(self) -> torch.Tensor:
        """Bool ``[V_d]``: rows at or above the target's logical vocabulary."""
        return torch.arange(self.shape.vocab_size) >= self.shape.target_vocab_size
