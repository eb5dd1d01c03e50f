"""A plain torch implementation of dspark's Markov block sampler and lossless verifier.

Written from DESIGN.md ("Drafting and verification") with ordinary torch ops (softmax, gather,
topk, multinomial), batched over requests. It is the peer the tests compare the engine against
(exactly on the greedy path, in distribution elsewhere) and the baseline of the benchmarks.
Randomness comes from a ``torch.Generator``, so it never matches the engine's counter-based
streams token for token: only greedy results are comparable one to one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

# Temperatures below this are greedy (dspark.GREEDY_BELOW, as vLLM).
GREEDY_BELOW = 1e-5
NEG_INF = float("-inf")


@dataclass(frozen=True)
class RefBlock:
    """What :func:`markov_block` drafted."""

    tokens: torch.Tensor  # [B, K] int64 target ids
    draft_logits: torch.Tensor  # [B, K, V_t] f32, softmax == q
    prev_embeddings: torch.Tensor  # [B, K, r] f32


@dataclass(frozen=True)
class RefVerification:
    """What :func:`verify` committed."""

    tokens: torch.Tensor  # [B, K+1] int64, -1 after the end
    num_accepted: torch.Tensor  # [B] int64


def draft_to_target(draft_vocab: int, target_vocab: int, d2t: torch.Tensor | None) -> torch.Tensor:
    """Target id of every draft id (``-1`` for padded draft ids ``>= V_t``)."""
    ids = torch.arange(draft_vocab, dtype=torch.int64)
    if d2t is not None:
        return ids + d2t.to(torch.int64).cpu()
    return torch.where(ids < target_vocab, ids, torch.full_like(ids, -1))


def markov_block(
    base: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    anchors: torch.Tensor,
    *,
    temperature: float = 0.0,
    target_vocab: int | None = None,
    d2t: torch.Tensor | None = None,
    top_k: int | None = None,
    logit_scale: float = 1.0,
    generator: torch.Generator | None = None,
) -> RefBlock:
    """Draft one block: slot k uses ``scale * (base_k + W2 @ W1[x_{k-1}])``, x_0 = anchor."""
    batch, slots, draft_vocab = base.shape
    dev = base.device
    vt = draft_vocab if target_vocab is None else target_vocab
    to_target = draft_to_target(draft_vocab, vt, d2t).to(dev)
    valid = to_target >= 0  # padded draft cols are masked
    w1f, w2f = w1.float(), w2.float()
    prev = anchors.to(dtype=torch.int64, device=dev)
    tokens = torch.empty(batch, slots, dtype=torch.int64, device=dev)
    q_logits = torch.full((batch, slots, vt), NEG_INF, device=dev)
    prev_emb = torch.empty(batch, slots, w1.shape[1], device=dev)
    rows = torch.arange(batch, device=dev)
    for k in range(slots):
        emb = w1f[prev]  # [B, r]
        prev_emb[:, k] = emb
        base_k = base[:, k].float().masked_fill(~valid, NEG_INF)
        logits = logit_scale * (base_k + emb @ w2f.T)
        logits = logits.masked_fill(~valid, NEG_INF)
        if top_k is not None:
            keep = torch.zeros_like(logits, dtype=torch.bool)
            keep.scatter_(1, torch.topk(base_k, top_k, dim=-1).indices, True)
            logits = logits.masked_fill(~keep, NEG_INF)
        if temperature < GREEDY_BELOW:
            x = torch.argmax(logits, dim=-1)
            recorded = torch.full_like(logits, NEG_INF)
            recorded[rows, x] = 0.0
        else:
            recorded = logits / temperature
            probs = torch.softmax(recorded, dim=-1)
            x = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        dst = to_target.clamp(min=0).expand(batch, -1)
        q_k = torch.full((batch, vt), NEG_INF, device=dev)
        q_k.scatter_(1, dst[:, valid], recorded[:, valid])
        q_logits[:, k] = q_k
        prev = to_target[x]
        tokens[:, k] = prev
    return RefBlock(tokens, q_logits, prev_emb)


def _per_request(
    value: float | Sequence | torch.Tensor | None, batch: int, dtype, device=None
) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.to(dtype=dtype, device=device)
    if isinstance(value, Sequence):
        return torch.tensor(list(value), dtype=dtype, device=device)
    return torch.full((batch,), value, dtype=dtype, device=device)


def target_probs(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
) -> torch.Tensor:
    """p per row: ``softmax(l / T)``, then top-k, then top-p (on the renormalized top-k mass).

    Greedy rows (T below ``GREEDY_BELOW``) get a one-hot p at the argmax (lowest id on ties).
    """
    batch, _, vocab = logits.shape
    greedy = temperature < GREEDY_BELOW
    t = torch.where(greedy, torch.ones_like(temperature), temperature)
    probs = torch.softmax(logits.float() / t[:, None, None], dim=-1)
    if top_k is not None:
        k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab)).clamp(max=vocab)
        sorted_p = torch.sort(probs, dim=-1, descending=True).values
        kth = sorted_p.gather(-1, (k - 1)[:, None, None].expand(batch, probs.shape[1], 1))
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
        probs = probs / probs.sum(-1, keepdim=True)
    if top_p is not None:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        before = torch.cumsum(sorted_p, dim=-1) - sorted_p
        keep_sorted = before < top_p[:, None, None]
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        probs = torch.where(keep, probs, torch.zeros_like(probs))
        probs = probs / probs.sum(-1, keepdim=True)
    if bool(greedy.any()):
        one_hot = torch.zeros_like(probs).scatter(
            -1, torch.argmax(logits, dim=-1, keepdim=True), 1.0
        )
        probs = torch.where(greedy[:, None, None], one_hot, probs)
    return probs


def verify(
    target_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_logits: torch.Tensor | None = None,
    *,
    temperature: float | Sequence[float] | torch.Tensor = 0.0,
    top_k: int | Sequence[int] | torch.Tensor | None = None,
    top_p: float | Sequence[float] | torch.Tensor | None = None,
    num_draft: Sequence[int] | torch.Tensor | None = None,
    stop_token_ids: Sequence[int] = (),
    generator: torch.Generator | None = None,
) -> RefVerification:
    """Lossless rejection sampling of a block, batched (``u * q(x) < p(x)``, residual, bonus)."""
    batch, width, vocab = target_logits.shape
    slots = width - 1
    dev = target_logits.device
    temp = _per_request(temperature, batch, torch.float32, dev)
    topk = None if top_k is None else _per_request(top_k, batch, torch.int64, dev)
    topp = None if top_p is None else _per_request(top_p, batch, torch.float32, dev)
    p = target_probs(target_logits, temp, topk, topp)  # [B, K+1, V]
    tok = draft_tokens.to(dtype=torch.int64, device=dev)
    if draft_logits is None:
        q = torch.zeros(batch, slots, vocab, device=dev).scatter(-1, tok[..., None], 1.0)
    else:
        q = torch.softmax(draft_logits.float(), dim=-1)
    px = p[:, :slots].gather(-1, tok[..., None]).squeeze(-1)
    qx = q.gather(-1, tok[..., None]).squeeze(-1)
    u = torch.rand(batch, slots, generator=generator, device=dev)
    accept = u * qx < px
    n = (
        torch.full((batch,), slots, dtype=torch.int64, device=dev)
        if num_draft is None
        else _per_request(num_draft, batch, torch.int64, dev)
    )
    pos = torch.arange(slots, device=dev)
    accept &= pos[None, :] < n[:, None]
    accepted = torch.cumprod(accept.to(torch.int64), dim=-1).sum(-1)  # prefix length
    if stop_token_ids:
        stops = torch.tensor(list(stop_token_ids), dtype=torch.int64, device=dev)
        is_stop = torch.isin(tok, stops) & (pos[None, :] < accepted[:, None])
        first = torch.where(is_stop, pos[None, :], torch.full_like(tok, slots)).min(-1).values
        stopped = first < slots
        accepted = torch.where(stopped, first + 1, accepted)
    else:
        stopped = torch.zeros(batch, dtype=torch.bool, device=dev)
    rows = torch.arange(batch, device=dev)
    at = accepted.clamp(max=slots)
    p_at = p[rows, at]
    rejected = accepted < n
    q_at = q[rows, at.clamp(max=slots - 1)] if slots > 0 else torch.zeros_like(p_at)
    residual = torch.clamp(p_at - q_at, min=0)
    mass = residual.sum(-1, keepdim=True)
    residual = torch.where(mass > 0, residual / mass.clamp(min=1e-30), p_at)
    # Bonus rows (all n drafts accepted) sample from p at row n.
    bonus_p = p[rows, n.clamp(max=slots)]
    dist = torch.where(rejected[:, None], residual, bonus_p)
    nxt = torch.multinomial(dist, 1, generator=generator).squeeze(1)
    out = torch.full((batch, width), -1, dtype=torch.int64, device=dev)
    keep = pos[None, :] < accepted[:, None]
    out[:, :slots] = torch.where(keep, tok, out[:, :slots])
    write = ~stopped
    out[rows[write], accepted[write]] = nxt[write]
    return RefVerification(out, accepted)
