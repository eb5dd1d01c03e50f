"""Typed checks of user arguments in the Python front (the Python half of the boundary rule).

Every helper raises a ``dspark.InputError`` with a stable ``.code`` that names the argument:
``invalid-argument`` (wrong type, bool or float where an int is meant, negative, NaN),
``too-large`` (above a limit), ``bad-shape``, ``unsupported-dtype`` or ``token-out-of-range``;
never a ``TypeError``, ``ValueError``, ``OverflowError`` or ``IndexError``.
"""

from __future__ import annotations

import math
import operator
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, SupportsFloat, SupportsIndex, TypeGuard

import numpy as np

from dspark._errors import raise_error
from dspark._native import LIMITS, InputError

if TYPE_CHECKING:
    import torch

__all__ = [
    "LIMITS",
    "MAX_SEED",
    "as_bool",
    "as_float",
    "as_int",
    "as_path",
    "as_seed",
    "dtype_name",
    "id_list",
    "id_rows",
    "is_torch",
    "torch_view",
]

#: The largest seed: seeds are u64 (beyond it, ``too-large``; never reduced modulo 2**64).
MAX_SEED = 2**64 - 1


def is_torch(x: object) -> TypeGuard[torch.Tensor]:
    """Whether ``x`` is a torch object (without importing torch); the callers only meet torch
    tensors there (parameters included)."""
    return type(x).__module__.split(".", 1)[0] == "torch"


def dtype_name(dtype: object, name: str = "dtype") -> str | None:
    """``dtype`` as the name the engine parses: a ``str`` as given, a ``torch.dtype`` (or
    anything whose ``str`` starts with ``torch.``) by that name, ``None`` as ``None``; anything
    else raises ``InputError`` (``invalid-argument``)."""
    if dtype is None or isinstance(dtype, str):
        return dtype
    text = str(dtype)
    if text.startswith("torch."):
        return text
    raise_error(
        InputError,
        "invalid-argument",
        f"{name}: expected 'float32', 'bfloat16', 'float16' or None, got {type(dtype).__name__}",
    )


def _is_bool(x: object) -> bool:
    return isinstance(x, (bool, np.bool_)) or type(x).__name__ in ("bool", "bool_")


def _type(x: object) -> str:
    return type(x).__name__


def as_int(value: object, name: str, *, lo: int | None = 0, hi: int | None = None) -> int:
    """``value`` as a Python int in ``[lo, hi]``: ints, numpy integers and anything with
    ``__index__``; never ``bool`` or ``float`` (``invalid-argument``); above ``hi``:
    ``too-large``."""
    if _is_bool(value):
        raise_error(InputError, "invalid-argument", f"{name}: expected an integer, got bool")
    try:
        if not isinstance(value, SupportsIndex):
            raise TypeError(value)
        v = operator.index(value)
    except Exception:
        raise_error(
            InputError, "invalid-argument", f"{name}: expected an integer, got {_type(value)}"
        )
    if lo is not None and v < lo:
        raise_error(InputError, "invalid-argument", f"{name}: {v} (must be >= {lo})")
    if hi is not None and v > hi:
        raise_error(InputError, "too-large", f"{name}: {v} exceeds the limit of {hi}")
    return v


def as_seed(value: object, name: str = "seed") -> int:
    """A seed: an int in ``[0, 2**64)`` (negative: ``invalid-argument``; beyond u64:
    ``too-large``)."""
    return as_int(value, name, lo=0, hi=MAX_SEED)


def as_bool(value: object, name: str) -> bool:
    """A flag: ``bool`` or numpy's ``bool_`` only; an int, a string or a tensor where a flag is
    meant is ``invalid-argument`` (never read through its truthiness)."""
    if not _is_bool(value):
        raise_error(InputError, "invalid-argument", f"{name}: expected a bool, got {_type(value)}")
    return bool(value)


def as_path(value: object, name: str) -> Path:
    """A filesystem path: ``str`` or ``os.PathLike`` of ``str`` (``None``, bytes or anything
    else: ``invalid-argument``; an empty or NUL-holding string too)."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise_error(
            InputError,
            "invalid-argument",
            f"{name}: expected a path (str or os.PathLike), got {_type(value)}",
        )
    if not value or "\0" in value:
        raise_error(InputError, "invalid-argument", f"{name}: {value!r} is not a path")
    return Path(value)


def as_float(value: object, name: str, *, finite: bool = True) -> float:
    """``value`` as a Python float (ints, floats, numpy scalars); never ``bool`` or ``str``.

    ``finite``: NaN and infinities are ``invalid-argument`` too.
    """
    if _is_bool(value) or isinstance(value, (str, bytes)):
        raise_error(
            InputError, "invalid-argument", f"{name}: expected a number, got {_type(value)}"
        )
    try:
        if not isinstance(value, (SupportsFloat, SupportsIndex)):
            raise TypeError(value)
        v = float(value)
    except Exception:
        raise_error(
            InputError, "invalid-argument", f"{name}: expected a number, got {_type(value)}"
        )
    if finite and not math.isfinite(v):
        raise_error(InputError, "invalid-argument", f"{name}: {v} (must be finite)")
    return v


def torch_view(x: torch.Tensor, name: str) -> torch.Tensor:
    """A detached torch tensor the DLPack export reads correctly.

    The lazy negative and conjugate bits are resolved (one copy, only for such views: DLPack
    has no flag for them); the meta device, sparse and nested tensors are refused
    (``invalid-argument``). Non-CPU devices are left to the caller (the kernels refuse them
    with a typed error; the torch drafter moves them to its own device).
    """
    x = x.detach()
    if getattr(x, "is_meta", False) or x.device.type == "meta":
        raise_error(
            InputError, "invalid-argument", f"{name}: a tensor on the meta device has no data"
        )
    if getattr(x, "is_nested", False):
        raise_error(InputError, "invalid-argument", f"{name}: nested tensors are not supported")
    if str(x.layout) != "torch.strided":
        raise_error(
            InputError,
            "invalid-argument",
            f"{name}: layout {x.layout} is not supported; call .to_dense() first",
        )
    if x.is_neg():
        x = x.resolve_neg()
    if x.is_conj():
        x = x.resolve_conj()
    return x


def _plain(x: object, name: str) -> object:
    """Tensors and arrays as (nested) Python lists; other values unchanged."""
    if is_torch(x):
        x = torch_view(x, name)
        if x.device.type != "cpu":
            x = x.cpu()
        if x.is_floating_point() or x.is_complex() or str(x.dtype) == "torch.bool":
            raise_error(InputError, "unsupported-dtype", f"{name}: {x.dtype} is not an id dtype")
        return x.tolist()
    if isinstance(x, np.ndarray):
        if x.dtype.kind not in "iu":
            raise_error(InputError, "unsupported-dtype", f"{name}: {x.dtype} is not an id dtype")
        return x.tolist()
    return x


def _as_list(v: object) -> list[object]:
    """A sequence (not text) as a list; anything else as a one-element list."""
    if isinstance(v, Sequence) and not isinstance(v, (str, bytes)):
        return list(v)
    return [v]


def id_list(x: object, name: str, vocab: int) -> list[int]:
    """A 1-D sequence of ids (list, tuple, tensor or array; a single int is one id), each an
    int in ``[0, vocab)`` (``token-out-of-range``)."""
    plain = _plain(x, name)
    values = list(plain) if isinstance(plain, (list, tuple)) else [plain]
    out = []
    for v in values:
        if isinstance(v, (list, tuple)):
            raise_error(InputError, "bad-shape", f"{name}: expected one dimension of ids")
        out.append(_id(v, name, vocab))
    return out


def _id(v: object, name: str, vocab: int) -> int:
    i = as_int(v, name, lo=None)
    if not 0 <= i < vocab:
        raise_error(InputError, "token-out-of-range", f"{name}: id {i} is outside [0, {vocab})")
    return i


def id_rows(x: object, name: str, vocab: int) -> list[list[int]]:
    """Prompts: a ``[B, S]`` or ``[S]`` tensor/array, a list of ints (one prompt) or a list of
    prompts (lists, tuples, 1-D tensors or arrays) of any lengths; ids in ``[0, vocab)``.

    More than two dimensions is ``bad-shape``; float or bool ids are ``unsupported-dtype`` /
    ``invalid-argument``; an empty batch or prompt is ``bad-shape``.
    """
    if is_torch(x) or isinstance(x, np.ndarray):
        if x.ndim not in (1, 2):
            raise_error(
                InputError,
                "bad-shape",
                f"{name}: expected [B, S] or [S], got shape {tuple(x.shape)}",
            )
        plain = _plain(x, name)
        rows = [_as_list(plain)] if x.ndim == 1 else [_as_list(r) for r in _as_list(plain)]
    elif isinstance(x, Sequence) and not isinstance(x, (str, bytes)):
        items = list(x)
        if items and all(not _is_row(i) for i in items):
            rows = [items]
        elif all(_is_row(i) for i in items):
            rows = []
            for r in items:
                if (is_torch(r) or isinstance(r, np.ndarray)) and r.ndim != 1:
                    raise_error(
                        InputError,
                        "bad-shape",
                        f"{name}: every prompt must be one-dimensional, got shape {tuple(r.shape)}",
                    )
                row = _as_list(_plain(r, name))
                if any(_is_row(v) for v in row):
                    raise_error(InputError, "bad-shape", f"{name}: more than two dimensions")
                rows.append(row)
        else:
            raise_error(
                InputError, "invalid-argument", f"{name}: mixes ids and prompts at one level"
            )
    else:
        raise_error(
            InputError,
            "invalid-argument",
            f"{name}: expected a [B, S] tensor or a list of prompts, got {_type(x)}",
        )
    if not rows or any(len(r) == 0 for r in rows):
        raise_error(InputError, "bad-shape", f"{name}: every prompt needs at least one token")
    return [[_id(v, name, vocab) for v in r] for r in rows]


def _is_row(x: object) -> bool:
    if is_torch(x) or isinstance(x, np.ndarray):
        return getattr(x, "ndim", 0) > 0
    return isinstance(x, Sequence) and not isinstance(x, (str, bytes))
