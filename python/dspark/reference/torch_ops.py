"""Plain-torch building blocks of the Qwen3 DSpark drafter forward (f32 math).

Shapes: ``B`` requests, ``T`` context positions, ``Q`` block slots, ``NH``/``KVH`` query/key-value
heads of width ``D``. Used by :mod:`dspark.reference.torch_drafter`; kept free of any engine
call so the torch drafter stays an independent reference for the candle one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["Rope", "attend", "counter_uniforms", "mlp", "rms_norm"]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3 RMSNorm over the last axis: ``x / sqrt(mean(x^2) + eps) * weight``."""
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


def mlp(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """SwiGLU: ``down(silu(gate(x)) * up(x))`` (torch ``[out, in]`` weight layout)."""
    return (torch.nn.functional.silu(x @ gate.T) * (x @ up.T)) @ down.T


@dataclass(frozen=True)
class Rope:
    """Rotary embedding, NeoX rotate-half layout, over the first ``rotary_dim`` of each head.

    ``rope_type`` ``"default"`` or ``"linear"`` (positions divided by ``factor``).
    """

    head_dim: int
    theta: float
    partial_rotary_factor: float = 1.0
    rope_type: str = "default"
    factor: float = 1.0

    @property
    def rotary_dim(self) -> int:
        """Number of rotated dimensions per head (even)."""
        return int(self.head_dim * self.partial_rotary_factor) // 2 * 2

    def apply(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate ``x`` ``[..., S, heads, D]`` at integer ``positions`` ``[..., S]``."""
        rd = self.rotary_dim
        if rd == 0:
            return x
        inv = 1.0 / (self.theta ** (torch.arange(0, rd, 2, dtype=torch.float64) / rd))
        pos = positions.to(torch.float64)
        if self.rope_type == "linear":
            pos = pos / self.factor
        freqs = pos[..., None] * inv  # [..., S, rd/2]
        emb = torch.cat([freqs, freqs], dim=-1)
        cos = emb.cos().to(x.dtype)[..., None, :]
        sin = emb.sin().to(x.dtype)[..., None, :]
        rot, rest = x[..., :rd], x[..., rd:]
        half = rd // 2
        rotated = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
        return torch.cat([rot * cos + rotated * sin, rest], dim=-1)


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None
) -> torch.Tensor:
    """Non-causal GQA attention: ``q [B,Q,NH,D]`` over ``k, v [B,S,KVH,D]`` → ``[B,Q,NH*D]``.

    ``key_mask [B,S]`` (True = attend) hides padded context keys.
    """
    b, nq, nh, d = q.shape
    groups = nh // k.shape[2]
    k = k.repeat_interleave(groups, dim=2)
    v = v.repeat_interleave(groups, dim=2)
    scores = torch.einsum("bqhd,bshd->bhqs", q, k) / math.sqrt(d)
    if key_mask is not None:
        scores = scores.masked_fill(~key_mask[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("bhqs,bshd->bqhd", probs, v).reshape(b, nq, nh * d)


_MASK64 = (1 << 64) - 1


def _signed(c: int) -> int:
    c &= _MASK64
    return c - (1 << 64) if c >= 1 << 63 else c


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_M1 = _signed(0xBF58476D1CE4E5B9)
_M2 = _signed(0x94D049BB133111EB)


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def _splitmix(x: torch.Tensor) -> torch.Tensor:
    z = x + _GOLDEN
    z = (z ^ _shr(z, 30)) * _M1
    z = (z ^ _shr(z, 27)) * _M2
    return z ^ _shr(z, 31)


def counter_uniforms(seeds: torch.Tensor, step: int, n: int) -> torch.Tensor:
    """Uniforms in ``(0, 1)``, ``[B, n]`` float64, keyed by (seed of row, step, column).

    Counter-based (splitmix64), so a request's draws do not depend on the batch it runs in.
    """
    base = _splitmix(_splitmix(seeds.to(torch.int64)) + step)
    z = _splitmix(base[:, None] ^ torch.arange(n, dtype=torch.int64)[None, :])
    return (_shr(z, 11).to(torch.float64) + 0.5) / float(1 << 53)
