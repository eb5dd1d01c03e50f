"""Drafting and verification kernels: typed Python front over ``dspark._native``.

Tensors go in through DLPack (numpy arrays, torch tensors, anything with ``__dlpack__``):
CPU, C-contiguous, float32/float16/bfloat16 for logits and weights, int32/int64/uint32 for ids.
Nothing is copied on the way in; non-contiguous input raises ``InputError`` (``bad-shape``).
Results come back as numpy arrays, or as torch tensors (zero-copy) when the main input was one:
each function is overloaded on its main input so a type checker knows which.

The native functions are the validation boundary: every value given to them is checked there
(typed errors), so the helpers below only reshape values (arrays and tensors into lists), they
do not judge them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar, overload

import numpy as np

from dspark import _native
from dspark._args import is_torch, torch_view
from dspark._errors import raise_error
from dspark._native import DSparkError, InputError

if TYPE_CHECKING:
    from dspark._typing import (
        DLPackTensor,
        FloatArray,
        IdArray,
        PerRequestFloat,
        PerRequestInt,
        TensorLike,
        TorchTensor,
    )

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

#: A host result of the engine (a numpy array), kept as its own array type.
_ArrayT = TypeVar("_ArrayT", bound="np.ndarray")
#: The type of a block's ids: ``IdArray`` (numpy int64) or a torch tensor.
IdsT_co = TypeVar("IdsT_co", covariant=True)
#: The type of a block's float results: ``FloatArray`` (numpy float32) or a torch tensor.
FloatsT_co = TypeVar("FloatsT_co", covariant=True)


@dataclass(frozen=True)
class DraftBlock(Generic[IdsT_co, FloatsT_co]):
    """A drafted block (numpy arrays, or torch tensors when the logits were torch).

    Attributes:
        tokens: ``[B, K]`` int64 target-vocabulary ids.
        draft_logits: ``[B, K, V_t]`` float32; ``softmax`` of a row is exactly the distribution
            the token was drawn from (``-inf`` outside its support).
        prev_embeddings: ``[B, K, r]`` float32, ``W1[x_{k-1}]`` (``x_0`` = anchor).
    """

    tokens: IdsT_co
    draft_logits: FloatsT_co
    prev_embeddings: FloatsT_co


@dataclass(frozen=True)
class Verification(Generic[IdsT_co]):
    """The committed tokens of a verified block (numpy, or torch when the logits were torch).

    Attributes:
        tokens: ``[B, K+1]`` int64: accepted drafts, then the correction or bonus token, then
            ``-1`` padding.
        num_accepted: ``[B]`` int64 number of accepted draft tokens.
    """

    tokens: IdsT_co
    num_accepted: IdsT_co


def _tensor(x: object, name: str) -> object:
    """Pass DLPack producers through untouched; turn plain sequences into numpy arrays.

    Torch tensors are detached (zero-copy), with the lazy negative/conjugate bits resolved;
    meta, sparse and nested tensors and anything that is not array-like raise ``InputError``
    naming the argument.
    """
    if x is None:
        raise_error(InputError, "invalid-argument", f"{name}: expected a tensor, got None")
    if is_torch(x):
        return torch_view(x, name)
    if hasattr(x, "__dlpack__"):
        return x
    try:
        return np.asarray(x)
    except Exception as e:
        raise_error(
            InputError, "invalid-argument", f"{name}: not array-like ({type(e).__name__}: {e})"
        )


def _out(like: object, arr: _ArrayT) -> TorchTensor | _ArrayT:
    """A host result in the caller's framework: a torch tensor (zero-copy, then moved to
    ``like``'s device) when ``like`` is torch, else the numpy array itself."""
    if is_torch(like):
        import torch

        t = torch.from_numpy(arr)
        return t if like.device.type == "cpu" else t.to(like.device)
    return arr


def _out_float(like: object, arr: FloatArray | DLPackTensor) -> TorchTensor | FloatArray:
    """A float result, which the engine may leave on a CUDA device (a DLPack producer, taken
    with no copy) instead of returning it on the host."""
    if isinstance(arr, np.ndarray):
        return _out(like, arr)
    from torch.utils.dlpack import from_dlpack

    return from_dlpack(arr)


def _param(x: object, name: str) -> object:
    """A scalar stays a scalar; an array or tensor becomes a list (one value per request).

    Values are not converted here: the native layer reads them with typed errors.
    """
    if x is None or isinstance(x, (int, float)):
        return x
    if isinstance(x, (np.integer, np.floating, np.bool_)):
        return x.item()
    if is_torch(x) or isinstance(x, np.ndarray):
        try:
            # ``tolist`` of a 0-d array or tensor gives a scalar.
            return torch_view(x, name).cpu().tolist() if is_torch(x) else x.tolist()
        except DSparkError:
            raise
        except Exception as e:
            raise_error(InputError, "invalid-argument", f"{name}: {type(e).__name__}: {e}")
    if isinstance(x, Sequence) and not isinstance(x, (str, bytes)):
        return [_param(v, name) if not isinstance(v, (int, float)) else v for v in x]
    return x


def _ids(x: object, name: str) -> list[object] | None:
    """Ids as a list (arrays and tensors too); a scalar becomes a one-element list."""
    if x is None:
        return None
    v = _param(x, name)
    return v if isinstance(v, list) else [v]


@overload
def sample_block(
    base_logits: TorchTensor,
    markov_w1: TensorLike,
    markov_w2: TensorLike,
    anchors: TensorLike,
    *,
    temperature: float = ...,
    seed: PerRequestInt = ...,
    target_vocab_size: int | None = ...,
    d2t: TensorLike | None = ...,
    top_k: int | None = ...,
    logit_scale: float = ...,
) -> DraftBlock[TorchTensor, TorchTensor]: ...
@overload
def sample_block(
    base_logits: TensorLike,
    markov_w1: TensorLike,
    markov_w2: TensorLike,
    anchors: TensorLike,
    *,
    temperature: float = ...,
    seed: PerRequestInt = ...,
    target_vocab_size: int | None = ...,
    d2t: TensorLike | None = ...,
    top_k: int | None = ...,
    logit_scale: float = ...,
) -> DraftBlock[IdArray, FloatArray]: ...
def sample_block(
    base_logits: TensorLike,
    markov_w1: TensorLike,
    markov_w2: TensorLike,
    anchors: TensorLike,
    *,
    temperature: float = 0.0,
    seed: PerRequestInt = 0,
    target_vocab_size: int | None = None,
    d2t: TensorLike | None = None,
    top_k: int | None = None,
    logit_scale: float = 1.0,
) -> DraftBlock[TorchTensor | IdArray, TorchTensor | FloatArray]:
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
    tokens, q, prev = _native.sample_block(
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
    return DraftBlock(
        _out(base_logits, tokens), _out_float(base_logits, q), _out_float(base_logits, prev)
    )


@overload
def verify(
    target_logits: TorchTensor,
    draft_tokens: TensorLike,
    draft_logits: TensorLike | None = ...,
    *,
    temperature: PerRequestFloat = ...,
    top_k: int | Sequence[int | None] | TensorLike | None = ...,
    top_p: PerRequestFloat | None = ...,
    seed: PerRequestInt = ...,
    num_draft: PerRequestInt | None = ...,
    stop_token_ids: PerRequestInt | None = ...,
) -> Verification[TorchTensor]: ...
@overload
def verify(
    target_logits: TensorLike,
    draft_tokens: TensorLike,
    draft_logits: TensorLike | None = ...,
    *,
    temperature: PerRequestFloat = ...,
    top_k: int | Sequence[int | None] | TensorLike | None = ...,
    top_p: PerRequestFloat | None = ...,
    seed: PerRequestInt = ...,
    num_draft: PerRequestInt | None = ...,
    stop_token_ids: PerRequestInt | None = ...,
) -> Verification[IdArray]: ...
def verify(
    target_logits: TensorLike,
    draft_tokens: TensorLike,
    draft_logits: TensorLike | None = None,
    *,
    temperature: PerRequestFloat = 0.0,
    top_k: int | Sequence[int | None] | TensorLike | None = None,
    top_p: PerRequestFloat | None = None,
    seed: PerRequestInt = 0,
    num_draft: PerRequestInt | None = None,
    stop_token_ids: PerRequestInt | None = None,
) -> Verification[TorchTensor | IdArray]:
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


def _bias(bias: object) -> object:
    """A scalar bias; a one-element array or tensor is read as its value."""
    if bias is None:
        return 0.0
    if is_torch(bias) or isinstance(bias, np.ndarray):
        try:
            flat = np.asarray(
                torch_view(bias, "bias").cpu() if is_torch(bias) else bias, dtype=np.float64
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


def _sts(sts: str | os.PathLike[str] | Sequence[float] | None) -> object:
    """A calibration path as a string, a table as a list (values checked natively)."""
    if isinstance(sts, os.PathLike):
        return os.fspath(sts)
    if sts is None or isinstance(sts, (str, bytes)):
        return sts
    table = _param(sts, "sts")
    return list(table) if isinstance(table, tuple) else table


@overload
def confidence(
    hidden: TorchTensor,
    prev_embeddings: TensorLike | None,
    weight: TensorLike,
    bias: float | TensorLike | None = ...,
    *,
    sts: str | os.PathLike[str] | Sequence[float] | None = ...,
) -> TorchTensor: ...
@overload
def confidence(
    hidden: TensorLike,
    prev_embeddings: TensorLike | None,
    weight: TensorLike,
    bias: float | TensorLike | None = ...,
    *,
    sts: str | os.PathLike[str] | Sequence[float] | None = ...,
) -> FloatArray: ...
def confidence(
    hidden: TensorLike,
    prev_embeddings: TensorLike | None,
    weight: TensorLike,
    bias: float | TensorLike | None = None,
    *,
    sts: str | os.PathLike[str] | Sequence[float] | None = None,
) -> TorchTensor | FloatArray:
    """Per-slot confidence ``sigmoid(w . [h ; prev] + b)`` in float32, ``[B, K]``.

    ``prev_embeddings=None`` scores ``w . h + b``. ``weight`` is ``[H (+ r)]`` (a ``[1, N]``
    linear weight is accepted; any other shape is ``bad-shape``). ``sts`` is a calibration
    JSON path or a list of per-position temperatures (``sigmoid(z / T_k)``).
    """
    out = _native.confidence(
        _tensor(hidden, "hidden"),
        None if prev_embeddings is None else _tensor(prev_embeddings, "prev_embeddings"),
        _tensor(weight, "weight"),
        _bias(bias),
        sts=_sts(sts),
    )
    return _out(hidden, out)


def schedule_threshold(confidence: TensorLike, threshold: float) -> list[int]:
    """Verify lengths: each request stops before its first slot with confidence < threshold."""
    return list(
        _native.schedule_threshold(
            _tensor(confidence, "confidence"), _param(threshold, "threshold")
        )
    )


def _table(steps_per_second: object) -> object:
    """The table as a list of pairs (arrays and tensors become lists); checked natively."""
    table = _param(steps_per_second, "steps_per_second")
    if isinstance(table, list):
        return [_param(p, "steps_per_second") for p in table]
    return table


def schedule_lengths(
    confidence: TensorLike,
    steps_per_second: Sequence[tuple[int, float]],
    interpolation: str = "step",
    *,
    ahead: TensorLike | None = None,
    batch_wide: bool = False,
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

    ``batch_wide=True`` is the look-ahead the engine runs: a request's next slot is verified
    when the best round holding it (over how many of the other requests' slots, at their
    current survival, and of its own later slots, priced with ``ahead``, it also verifies)
    beats the best round that stops the request there. A row tile then pays when the whole
    batch repays it. Lossless too: a request's choice never reads its own later confidences.
    Batches of more than 512 slots take the single-request look-ahead.
    """
    table = _table(steps_per_second)
    return list(
        _native.schedule_lengths(
            _tensor(confidence, "confidence"),
            table,
            interpolation,
            ahead=None if ahead is None else _tensor(ahead, "ahead"),
            batch_wide=batch_wide,
        )
    )


def schedule_pipelined(
    stale: TensorLike,
    current: TensorLike,
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
