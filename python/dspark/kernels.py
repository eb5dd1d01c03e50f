"""Drafting and verification kernels: typed Python front over ``dspark._native``.

Tensors go in through DLPack (numpy arrays, torch tensors, anything with ``__dlpack__``):
CPU, C-contiguous, float32/float16/bfloat16 for logits and weights, int32/int64/uint32 for ids.
Nothing is copied on the way in; non-contiguous input raises ``InputError`` (``bad-shape``).
Results come back as numpy arrays, or as torch tensors (zero-copy) when the main input was one.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dspark import _native
from dspark._args import is_torch, torch_view
from dspark._errors import raise_error
from dspark._native import DSparkError, InputError

__all__ = [
    "DraftBlock",
    "Verification",
    "confidence",
    "sample_block",
    "schedule_lengths",
    "schedule_pipelined",
    "schedule_threshold",
    "verify",
]


@dataclass(frozen=True)
class DraftBlock:
    """A drafted block.

    Attributes:
        tokens: ``[B, K]`` int64 target-vocabulary ids.
        draft_logits: ``[B, K, V_t]`` float32; ``softmax`` of a row is exactly the distribution
            the token was drawn from (``-inf`` outside its support).
        prev_embeddings: ``[B, K, r]`` float32, ``W1[x_{k-1}]`` (``x_0`` = anchor).
    """

    tokens: Any
    draft_logits: Any
    prev_embeddings: Any


@dataclass(frozen=True)
class Verification:
    """The committed tokens of a verified block.

    Attributes:
        tokens: ``[B, K+1]`` int64: accepted drafts, then the correction or bonus token, then
            ``-1`` padding.
        num_accepted: ``[B]`` int64 number of accepted draft tokens.
    """

    tokens: Any
    num_accepted: Any


def _is_torch(x: object) -> bool:
    return is_torch(x)


def _tensor(x: object, name: str) -> object:
    """Pass DLPack producers through untouched; turn plain sequences into numpy arrays.

    Torch tensors are detached (zero-copy), with the lazy negative/conjugate bits resolved;
    meta, sparse and nested tensors and anything that is not array-like raise ``InputError``
    naming the argument.
    """
    if x is None:
        raise_error(InputError, "invalid-argument", f"{name}: expected a tensor, got None")
    if _is_torch(x):
        return torch_view(x, name)
    if hasattr(x, "__dlpack__"):
        return x
    try:
        return np.asarray(x)
    except Exception as e:
        raise_error(
            InputError, "invalid-argument", f"{name}: not array-like ({type(e).__name__}: {e})"
        )


def _out(like: object, arr: Any) -> Any:
    """A result in the caller's framework: torch on ``like``'s device when ``like`` is torch.

    Results the engine leaves on a CUDA device (``_native.DeviceArray``) are taken by DLPack
    with no copy; small host results (ids, counts, confidences) are moved to ``like``'s device.
    """
    if not isinstance(arr, np.ndarray):
        import torch

        return torch.from_dlpack(arr)
    if _is_torch(like):
        import torch

        t = torch.from_numpy(arr)
        device = like.device  # type: ignore[attr-defined]
        return t if device.type == "cpu" else t.to(device)
    return arr


def _param(x: object, name: str) -> object:
    """A scalar stays a scalar; an array or tensor becomes a list (one value per request).

    Values are not converted here: the native layer reads them with typed errors.
    """
    if x is None or isinstance(x, (int, float)):
        return x
    if isinstance(x, (np.integer, np.floating, np.bool_)):
        return x.item()
    if _is_torch(x) or isinstance(x, np.ndarray):
        try:
            if _is_torch(x):
                x = torch_view(x, name).cpu()
            return x.tolist()  # type: ignore[attr-defined]  # a 0-d array gives a scalar
        except DSparkError:
            raise
        except Exception as e:
            raise_error(InputError, "invalid-argument", f"{name}: {type(e).__name__}: {e}")
    if isinstance(x, Sequence) and not isinstance(x, (str, bytes)):
        return [_param(v, name) if not isinstance(v, (int, float)) else v for v in x]
    return x


def _ids(x: object, name: str) -> object:
    """Ids as a list (arrays and tensors too); a scalar becomes a one-element list."""
    if x is None:
        return None
    v = _param(x, name)
    return v if isinstance(v, list) else [v]


def sample_block(
    base_logits: Any,
    markov_w1: Any,
    markov_w2: Any,
    anchors: Any,
    *,
    temperature: float = 0.0,
    seed: int | Sequence[int] | Any = 0,
    target_vocab_size: int | None = None,
    d2t: Any = None,
    top_k: int | None = None,
    logit_scale: float = 1.0,
) -> DraftBlock:
    """Draft a block with the rank-r Markov head.

    Slot k samples from ``logit_scale * (base_k + W2 @ W1[x_{k-1}])`` (``x_0`` = anchor, W1
    indexed by target id), with padded draft columns ``[V_t, V_d)`` masked, greedily when
    ``temperature == 0`` (lowest id on ties), else at ``temperature``; ``top_k`` biases only the
    base top-k candidates. ``target_vocab_size=None`` means ``V_t = V_d``; ``d2t`` (int64
    offsets, ``target = draft + d2t[draft]``) maps a reduced vocabulary.

    Args:
        base_logits: ``[B, K, V_d]`` draft logits (float32/16, bfloat16).
        markov_w1: ``[V_in, r]`` embedding of the previous token.
        markov_w2: ``[V_d, r]`` projection back to the draft vocabulary.
        anchors: ``[B]`` target ids of the last committed tokens.
        seed: one seed (row r uses stream (seed, r)) or one per request (order independent).
    """
    out = _native.sample_block(
        _tensor(base_logits, "base_logits"),
        _tensor(markov_w1, "markov_w1"),
        _tensor(markov_w2, "markov_w2"),
        _tensor(anchors, "anchors"),
        temperature=_param(temperature, "temperature"),
        seed=_param(seed, "seed"),
        target_vocab_size=_param(target_vocab_size, "target_vocab_size"),
        d2t=None if d2t is None else _tensor(d2t, "d2t"),
        top_k=_param(top_k, "top_k"),
        logit_scale=_param(logit_scale, "logit_scale"),
    )
    tokens, q, prev = (_out(base_logits, a) for a in out)
    return DraftBlock(tokens, q, prev)


def verify(
    target_logits: Any,
    draft_tokens: Any,
    draft_logits: Any = None,
    *,
    temperature: float | Sequence[float] | Any = 0.0,
    top_k: int | Sequence[int | None] | Any = None,
    top_p: float | Sequence[float] | Any = None,
    seed: int | Sequence[int] | Any = 0,
    num_draft: Sequence[int] | Any = None,
    stop_token_ids: Sequence[int] | Any = None,
) -> Verification:
    """Lossless rejection sampling of a drafted block.

    ``p`` per request is ``softmax(logits / T)`` then top-k then top-p, renormalized; draft
    token ``x_k`` is accepted iff ``u * q(x_k) < p(x_k)`` (``draft_logits=None``: one-hot q),
    prefix-cumulative; the first rejection samples from ``norm(max(p - q, 0))``; all accepted
    gives a bonus token. ``T == 0`` requests are greedy. Per-request values may be arrays;
    in a per-request ``top_k``, ``None`` or a negative value means "off".

    Args:
        target_logits: ``[B, K+1, V_t]``.
        draft_tokens: ``[B, K]`` target ids.
        draft_logits: ``[B, K, V_t]`` (as returned by :func:`sample_block`) or ``None``.
        num_draft: verify only the first ``num_draft[r]`` drafts of request r.
        stop_token_ids: an accepted stop token ends the round (no bonus).
    """
    tokens, accepted = _native.verify(
        _tensor(target_logits, "target_logits"),
        _tensor(draft_tokens, "draft_tokens"),
        None if draft_logits is None else _tensor(draft_logits, "draft_logits"),
        temperature=_param(temperature, "temperature"),
        top_k=_param(top_k, "top_k"),
        top_p=_param(top_p, "top_p"),
        seed=_param(seed, "seed"),
        num_draft=_ids(num_draft, "num_draft"),
        stop_token_ids=_ids(stop_token_ids, "stop_token_ids"),
    )
    return Verification(_out(target_logits, tokens), _out(target_logits, accepted))


def _bias(bias: Any) -> object:
    """A scalar bias; a one-element array or tensor is read as its value."""
    if bias is None:
        return 0.0
    if _is_torch(bias) or isinstance(bias, np.ndarray):
        try:
            flat = np.asarray(
                torch_view(bias, "bias").cpu() if _is_torch(bias) else bias, dtype=np.float64
            )
        except DSparkError:
            raise
        except Exception as e:
            raise_error(InputError, "invalid-argument", f"bias: {type(e).__name__}: {e}")
        if flat.size != 1:
            raise_error(
                InputError, "bad-shape", f"bias: must hold one value, got shape {flat.shape}"
            )
        return float(flat.reshape(()))
    return _param(bias, "bias")


def confidence(
    hidden: Any,
    prev_embeddings: Any,
    weight: Any,
    bias: Any = None,
    *,
    sts: str | os.PathLike[str] | Sequence[float] | None = None,
) -> Any:
    """Per-slot confidence ``sigmoid(w . [h ; prev] + b)`` in float32, ``[B, K]``.

    ``prev_embeddings=None`` scores ``w . h + b``. ``weight`` is ``[H (+ r)]`` (a ``[1, N]``
    linear weight is accepted; any other shape is ``bad-shape``). ``sts`` is a calibration
    JSON path or a list of per-position temperatures (``sigmoid(z / T_k)``).
    """
    if isinstance(sts, os.PathLike):
        sts = os.fspath(sts)
    elif sts is not None and not isinstance(sts, (str, bytes)):
        sts = _param(sts, "sts")
        if isinstance(sts, tuple):
            sts = list(sts)
    out = _native.confidence(
        _tensor(hidden, "hidden"),
        None if prev_embeddings is None else _tensor(prev_embeddings, "prev_embeddings"),
        _tensor(weight, "weight"),
        _bias(bias),
        sts=sts,
    )
    return _out(hidden, out)


def schedule_threshold(confidence: Any, threshold: float) -> list[int]:
    """Verify lengths: each request stops before its first slot with confidence < threshold."""
    return list(
        _native.schedule_threshold(
            _tensor(confidence, "confidence"), _param(threshold, "threshold")
        )
    )


def _table(steps_per_second: Any) -> Any:
    """The table as a list of pairs (arrays and tensors become lists); checked natively."""
    table = _param(steps_per_second, "steps_per_second")
    if isinstance(table, list):
        return [_param(p, "steps_per_second") for p in table]
    return table


def schedule_lengths(
    confidence: Any,
    steps_per_second: Sequence[tuple[int, float]],
    interpolation: str = "step",
    *,
    ahead: Any | None = None,
) -> list[int]:
    """The paper's scheduler: admit slots by survival while tokens x SPS strictly improves.

    ``steps_per_second`` is a table of ``(total verified tokens, steps per second)`` points,
    read as a step function (``"step"``: the value at the smallest profiled size ``>= n``) or
    interpolated (``"linear"``); past the last point tokens/s is held constant.

    ``ahead`` (``[B, K]`` like ``confidence``): each slot's acceptance predicted WITHOUT this
    round's draws (e.g. measured in earlier rounds). A slot is then also admitted when it and
    its request's next slots, priced with ``ahead``, would improve the objective, so the scan
    can cross a cliff in the table; still lossless, since no choice reads a later slot's
    current confidence.
    """
    table = _table(steps_per_second)
    return list(
        _native.schedule_lengths(
            _tensor(confidence, "confidence"),
            table,
            interpolation,
            ahead=None if ahead is None else _tensor(ahead, "ahead"),
        )
    )


def schedule_pipelined(
    stale: Any,
    current: Any,
    steps_per_second: Sequence[tuple[int, float]],
    interpolation: str = "step",
) -> list[int]:
    """Pipelined scheduler: capacity from ``stale`` confidences, slots by ``current`` survival."""
    table = _table(steps_per_second)
    return list(
        _native.schedule_pipelined(
            _tensor(stale, "stale"), _tensor(current, "current"), table, interpolation
        )
    )
