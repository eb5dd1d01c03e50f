"""The DSpark training objective on many anchored blocks per sequence.

Per sequence, ``num_anchors`` anchor positions ``a`` are drawn (optionally leaning towards *hard*
anchors, see :func:`anchor_hardness`); block ``[t_a, M, ..., M]`` sits at
positions ``a..a+K-1``; slot ``k`` predicts position ``a+k+1``, its Markov input is the true
token ``t_{a+k}`` (teacher forcing) and its target distribution ``p_t`` is the target's softmax
at position ``a+k``. Block queries see context positions ``< a`` and their own block.

Loss per slot, weighted by ``exp(-k / decay)`` (DeepSpec's position decay):
``ce_weight * CE(q, argmax p_t) + tv_weight * 0.5 * ||q - p_t||_1 + conf_weight * BCE(c, y)``.
The CE label is the target's own greedy token: the corpus is not target-generated, so this is
the analogue of DeepSpec's regenerated answers.

The confidence label ``y`` (detached) is one of :data:`CONFIDENCE_LABELS`, see
:func:`confidence_targets`: ``"t1"`` is ``1 - 0.5 * ||q - p_t||_1``, the acceptance probability
of sampling at T = 1; ``"greedy"`` is what a greedy serving loop observes, whether slot k's draft
is the target's argmax, on the slots that greedy verification would reach.
:func:`greedy_walk_samples` and :func:`confidence_loss` train the confidence head alone on the
greedy label, on exactly the rounds a greedy serving loop runs (everything else frozen).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812

from dspark.train.drafter_model import TrainableDrafter

__all__ = [
    "CONFIDENCE_LABELS",
    "BlockBatch",
    "LossWeights",
    "anchor_hardness",
    "blocks_at",
    "confidence_loss",
    "confidence_targets",
    "dspark_loss",
    "greedy_walk_samples",
    "make_blocks",
]

#: Confidence labels: ``"t1"`` (acceptance probability at T = 1) and ``"greedy"`` (accepted or
#: not under greedy verification, on the slots it reaches). See :func:`confidence_targets`.
CONFIDENCE_LABELS = ("t1", "greedy")


@dataclass(frozen=True)
class LossWeights:
    """Term weights, the position decay and the confidence label (see
    :func:`confidence_targets`)."""

    ce: float = 0.5
    tv: float = 0.5
    conf: float = 1.0
    decay: float = 4.0
    conf_label: str = "t1"


@dataclass(frozen=True)
class BlockBatch:
    """Flattened blocks of a batch: ids, positions, Markov inputs ``[B, A*K]`` and the mask."""

    block_ids: torch.Tensor
    block_pos: torch.Tensor
    prev_ids: torch.Tensor
    mask: torch.Tensor  # [B, A*K, T + A*K]
    num_anchors: int


def anchor_hardness(target_logits: torch.Tensor) -> torch.Tensor:
    """``[B, T]``: how unsure the target was of the token at each position, ``1 - max p_t`` of
    the previous position's distribution (0 at position 0).

    At inference a round starts right after the drafter missed: its anchor is the target's
    correction token, and misses cluster where the target itself is unsure. Uniform anchors
    under-train exactly those starts (per round, slot 0 was accepted 0.49 of the time against a
    uniform agreement of 0.69), so part of the anchors are drawn in proportion to this (with half
    of them hard, the bundled drafter's per-round slot-0 acceptance rose to 0.82).
    """
    with torch.no_grad():
        top = torch.softmax(target_logits.float(), dim=-1).amax(-1)  # [B, T]
    h = torch.zeros_like(top)
    h[:, 1:] = 1.0 - top[:, :-1]
    return h


def make_blocks(
    tokens: torch.Tensor,
    block_size: int,
    mask_id: int,
    num_anchors: int,
    gen: torch.Generator,
    hardness: torch.Tensor | None = None,
    hard_share: float = 0.0,
    first: int = 1,
) -> BlockBatch:
    """Draw anchors in ``[first, T-K-1]`` (distinct, sorted) per sequence of ``tokens [B, T]``.

    Uniformly, or with ``hardness [B, T]`` and ``hard_share`` in ``(0, 1]``: from the mixture
    ``(1 - hard_share) * uniform + hard_share * hardness / sum(hardness)`` (without replacement).
    ``first`` (at least 1) keeps anchors near the end of long windows, where served rounds start.
    """
    b, t = tokens.shape
    k = block_size
    hi = t - k - 1  # last anchor: label a+K must exist
    if not 1 <= first <= hi:
        raise ValueError(
            f"sequence length {t} too short for block size {k} with anchors from {first}"
        )
    if not 0.0 <= hard_share <= 1.0:
        raise ValueError(f"hard_share {hard_share} must be in [0, 1]")
    span = hi - first + 1
    a_n = min(num_anchors, span)
    if hardness is None or hard_share == 0.0:
        anchors = torch.stack(
            [torch.randperm(span, generator=gen)[:a_n].sort().values + first for _ in range(b)]
        )  # [B, A]
    else:
        h = hardness[:, first : hi + 1].float().clamp_min(0.0)
        h = h / h.sum(dim=1, keepdim=True).clamp_min(1e-12)
        w = (1.0 - hard_share) / span + hard_share * h
        anchors = torch.multinomial(w, a_n, replacement=False, generator=gen).sort().values
        anchors = anchors + first
    return blocks_at(tokens, anchors, k, mask_id)


def blocks_at(
    tokens: torch.Tensor, anchors: torch.Tensor, block_size: int, mask_id: int
) -> BlockBatch:
    """The blocks of ``tokens [B, T]`` at the sorted, distinct anchors ``anchors [B, A]``
    (each in ``[1, T - K - 1]``), laid out as :func:`make_blocks` does."""
    b, t = tokens.shape
    k = block_size
    a_n = anchors.shape[1]
    offs = torch.arange(k)
    pos = (anchors[:, :, None] + offs).reshape(b, a_n * k)  # [B, A*K]
    prev = torch.gather(tokens, 1, pos)  # t_{a+k}: anchor at slot 0, true tokens after
    ids = torch.full_like(pos, mask_id)
    ids[:, ::k] = prev[:, ::k]
    anchor_of_q = anchors.repeat_interleave(k, dim=1)  # [B, A*K]
    ctx_mask = torch.arange(t)[None, None, :] < anchor_of_q[:, :, None]
    blk = torch.arange(a_n).repeat_interleave(k)
    blk_mask = (blk[:, None] == blk[None, :]).expand(b, -1, -1)
    return BlockBatch(ids, pos, prev, torch.cat([ctx_mask, blk_mask], dim=2), a_n)


def confidence_targets(
    logits: torch.Tensor,
    greedy: torch.Tensor,
    prev_ids: torch.Tensor,
    tv: torch.Tensor,
    block_size: int,
    label: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(y, weight)``, both ``[B, Q]`` and detached: the confidence label of every slot and
    whether it counts.

    ``logits [B, Q, V_d]`` the drafter's (teacher-forced) slot logits, ``greedy [B, Q]`` the
    target's argmax token at each slot, ``prev_ids [B, Q]`` each slot's Markov input,
    ``tv [B, Q]`` the total variation ``0.5 * ||q - p_t||_1``.

    - ``"t1"``: ``y = 1 - tv`` on every slot: the probability that rejection sampling at T = 1
      accepts slot k's draft, given the slots before it were accepted.
    - ``"greedy"``: ``y = 1`` iff slot k's argmax equals the target's argmax (greedy
      verification accepts it), counted only where greedy verification reaches slot k with this
      very input: every earlier slot ``j`` of the block was accepted AND the teacher-forced token
      after it (slot ``j + 1``'s Markov input) is the target's argmax, so the Markov input the
      drafter saw is the token it drafted and the block prefix is the target's greedy path.
      These are exactly the ``(position, confidence, accepted)`` samples that ``dspark
      calibrate`` (greedy) collects, so a head trained on them needs no bias correction.
    """
    if label == "t1":
        return (1.0 - tv).detach(), torch.ones_like(tv)
    if label != "greedy":
        raise ValueError(f"confidence label {label!r} is not one of {CONFIDENCE_LABELS}")
    b, q = greedy.shape
    k = block_size
    with torch.no_grad():
        agree = logits.argmax(-1) == greedy  # [B, Q]
        nxt = torch.zeros_like(agree)  # slot j+1's Markov input is the target's argmax at j
        nxt[:, :-1] = prev_ids[:, 1:] == greedy[:, :-1]
        ok = (agree & nxt).view(b, q // k, k).float()
        reached = torch.ones_like(ok)
        reached[:, :, 1:] = torch.cumprod(ok[:, :, :-1], dim=2)
    return agree.float(), reached.view(b, q)


def _slot_targets(
    target_logits: torch.Tensor, batch: BlockBatch
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(p_t [B, Q, V_t] f32, argmax [B, Q])`` of the target at every slot's position."""
    p_t = torch.softmax(
        torch.gather(
            target_logits, 1, batch.block_pos[:, :, None].expand(-1, -1, target_logits.shape[-1])
        ).float(),
        dim=-1,
    )
    return p_t, p_t.argmax(-1)


def dspark_loss(
    model: TrainableDrafter,
    features: torch.Tensor,
    target_logits: torch.Tensor,
    batch: BlockBatch,
    w: LossWeights,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Total loss and its parts (plus teacher-forced greedy agreement) for logging."""
    k = model.shape.block_size
    v_t = model.shape.target_vocab_size
    hidden = model.backbone(features, batch.block_ids, batch.block_pos, batch.mask)
    logits, conf = model.heads(hidden, batch.prev_ids)  # [B, Q, V_d], [B, Q]
    p_t, label = _slot_targets(target_logits, batch)  # [B, Q, V_t], [B, Q]
    log_q = torch.log_softmax(logits[..., :v_t], dim=-1)
    q = log_q.exp()
    ce = F.nll_loss(log_q.flatten(0, 1), label.flatten(), reduction="none").view_as(label)
    tv = 0.5 * (q - p_t).abs().sum(-1)
    y, cw = confidence_targets(logits, label, batch.prev_ids, tv, k, w.conf_label)
    bce = F.binary_cross_entropy_with_logits(conf, y, reduction="none") * cw
    slot = torch.arange(batch.block_ids.shape[1]) % k
    pw = torch.exp(-slot.float() / w.decay)
    pw = pw / pw.mean()
    total = ((w.ce * ce + w.tv * tv + w.conf * bce) * pw).mean()
    agree = (logits.argmax(-1) == label).float()
    parts = {
        "ce": float(ce.detach().mean()),
        "tv": float(tv.detach().mean()),
        "bce": float(bce.detach().sum() / cw.sum().clamp_min(1.0)),
        "agree0": float(agree[:, slot == 0].mean()),
        "agree_last": float(agree[:, slot == k - 1].mean()),
    }
    return total, parts


def greedy_walk_samples(
    model: TrainableDrafter,
    features: torch.Tensor,
    target_logits: torch.Tensor,
    tokens: torch.Tensor,
    start: int,
    end: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Confidence samples of exactly the rounds a greedy serving loop runs on ``tokens [B, T]``,
    prompts of ``start`` tokens continued greedily by the target: ``(x [N, H + r], y [N],
    slot [N], row [N])``, the head's input ``[h_k ; W1[x_{k-1}]]``, the greedy label
    (:func:`confidence_targets`), the slot index and the sequence, without gradient. The head is
    ``sigmoid(proj(x))``: a logistic regression on ``x`` (:func:`confidence_loss`).

    Greedy speculative decoding commits the target's greedy path, so on such a sequence every
    round is known in advance: the first anchor is the target's first token (position
    ``start``); a round with ``j`` slots accepted commits them and the target's token after
    them, so the next anchor is ``a + j + 1``. Blocks are evaluated at every anchor of the
    continuation (teacher forcing is exact here: each Markov input is the token the drafter
    drafted whenever the slot is reached) and the walk keeps the rounds on the serving path,
    and in each the slots greedy verification reaches. ``end``: the last anchor a round may
    have (a loop that stops at ``n`` new tokens has its last at ``start + n - 2``); default
    and at most ``T - K - 1``, the last whose block has all its labels. Unlike uniformly or
    hard-drawn anchors, this reproduces where rounds start: right after the drafter's misses.
    """
    b, t = tokens.shape
    k = model.shape.block_size
    last = t - k - 1 if end is None else min(end, t - k - 1)
    if not 1 <= start <= last:
        raise ValueError(f"start {start} must be in [1, {last}] for length {t}, block {k}")
    anchors = torch.arange(start, last + 1).expand(b, -1)
    batch = blocks_at(tokens, anchors, k, model.shape.mask_token_id)
    with torch.no_grad():
        hidden = model.backbone(features, batch.block_ids, batch.block_pos, batch.mask)
        logits, _ = model.heads(hidden, batch.prev_ids)
        _, greedy = _slot_targets(target_logits, batch)
        tv = torch.zeros_like(greedy, dtype=torch.float32)
        y, reached = confidence_targets(logits, greedy, batch.prev_ids, tv, k, "greedy")
        a_n = anchors.shape[1]
        acc = (y * reached).view(b, a_n, k)  # slot accepted (and on the greedy path)
        run = torch.cumprod(acc, dim=2).sum(dim=2).long()  # leading accepted slots per block
        on_path = torch.zeros(b, a_n, dtype=torch.bool)
        for r in range(b):
            i = 0
            while i < a_n:
                on_path[r, i] = True
                i += int(run[r, i]) + 1
        keep = (reached > 0) & on_path.repeat_interleave(k, dim=1)
        x = torch.cat([hidden, model.markov_head.markov_w1(batch.prev_ids)], dim=-1)
        slot = (torch.arange(a_n * k) % k).expand_as(keep)
        row = torch.arange(b)[:, None].expand_as(keep)
    return x[keep], y[keep], slot[keep], row[keep]


def confidence_loss(
    model: TrainableDrafter,
    x: torch.Tensor,
    y: torch.Tensor,
    weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """(Weighted) mean BCE of the confidence head ``sigmoid(proj(x))`` on samples of
    :func:`greedy_walk_samples`; gradient reaches ``model.confidence_head`` only."""
    z = model.confidence_head.proj(x).squeeze(-1)
    bce = F.binary_cross_entropy_with_logits(z, y, reduction="none")
    if weight is None:
        return bce.mean()
    return (bce * weight).sum() / weight.sum()
