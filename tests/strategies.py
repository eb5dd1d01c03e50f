"""Hypothesis strategies and the outcome rule shared by the property tests.

Every property test calls the API through :func:`outcome`: a call must end in exactly one of two
ways, a typed ``dspark.DSparkError`` with a known ``.code``, or a result that satisfies the
documented contract (checked by the test). Anything else (an untyped exception,
``PanicException``, an abort) fails the test. The strategies generate shapes (zero-size, with
one huge dimension, wrong rank), dtypes, strides, odd values (NaN, +-inf, huge, negative) and
ids.

Deterministic and bounded for CI: ``derandomize=True`` (a fixed seed) and
``DSPARK_PROPERTY_EXAMPLES`` examples per property (default 60). Importing this module skips
the importing test file when hypothesis is not installed; test files take ``given`` and ``st``
from here for that reason.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import dspark  # noqa: E402

__all__ = [
    "CODES",
    "EXAMPLES",
    "HUGE",
    "ODD_FLOATS",
    "ODD_SCALARS",
    "PROPS",
    "check_verification",
    "float_arrays",
    "given",
    "id_arrays",
    "odd_or",
    "outcome",
    "rarely",
    "shapes",
    "st",
]

EXAMPLES = int(os.environ.get("DSPARK_PROPERTY_EXAMPLES", "60"))
PROPS = settings(
    derandomize=True,
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)

#: Every stable code the engine and the Python front may raise.
CODES = {
    "bad-config",
    "no-noise-token",
    "noise-token-out-of-range",
    "missing-file",
    "io",
    "bad-safetensors",
    "bad-gguf",
    "shape-mismatch",
    "missing-tensor",
    "bad-dtype",
    "missing-lm-head",
    "missing-d2t",
    "missing-embed-tokens",
    "d2t-wrong-length",
    "d2t-out-of-range",
    "d2t-duplicate",
    "target-mismatch",
    "multiple",
    "bad-shape",
    "unsupported-dtype",
    "non-finite",
    "token-out-of-range",
    "invalid-argument",
    "too-large",
    "device-unavailable",
    "device-mismatch",
    "callback",
    "backend",
    "out-of-memory",
}

HUGE = [2**31, 2**32 + 5, 2**40]
ODD_FLOATS = [float("nan"), float("inf"), float("-inf"), 1e38, -1e38, 3.4e39, 0.0, -0.0]
ODD_SCALARS = [
    None,
    True,
    -1,
    0,
    1,
    2**31,
    2**64,
    2**70,
    -(2**70),
    2.5,
    float("nan"),
    float("inf"),
    "x",
    b"y",
    [1, 2],
    (3,),
    [],
    {"a": 1},
    np.int64(3),
    np.float32(0.5),
    np.bool_(True),
    object(),
]


def outcome(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call ``fn``: a typed dspark error (returns ``None``) or its result; anything else raises."""
    try:
        return fn(*args, **kwargs)
    except dspark.DSparkError as e:
        assert isinstance(e.code, str) and e.code in CODES, f"unknown code {e.code!r}: {e}"
        assert e.code != "internal", f"a panic reached the boundary: {e}"
        assert isinstance(e.problems, list) and e.problems, e
        return None


# --- strategies ------------------------------------------------------------------------------


def rarely(main: Any, rare: Any, n: int = 10) -> Any:
    """``main``, or ``rare`` one time in ``n`` (``one_of`` would pick each branch equally)."""
    # Compare with a middle value: hypothesis favours the bounds of an integer range.
    return st.integers(1, n).flatmap(lambda i: rare if i == (n + 1) // 2 else main)


@st.composite
def shapes(draw: Any, ndim: int, max_dim: int = 4) -> tuple[int, ...]:
    """Mostly ``ndim`` small dims; sometimes a wrong rank, or zero-size with one huge dim."""
    n = (
        ndim
        if draw(st.integers(0, 9)) != 5
        else draw(st.sampled_from([max(ndim - 1, 0), ndim + 1]))
    )
    dims = [draw(st.integers(0 if draw(st.integers(0, 9)) == 5 else 1, max_dim)) for _ in range(n)]
    if n >= 2 and draw(st.integers(0, 11)) == 6:
        i, j = draw(st.permutations(range(n)))[:2]
        dims[i], dims[j] = draw(st.sampled_from(HUGE)), 0
    return tuple(dims)


FLOAT_DTYPES = ["float16", "float64", "int64", "bool"]
ID_DTYPES = ["int32", "uint32", "float32", "bool", "uint8"]


@st.composite
def float_arrays(draw: Any, ndim: int, max_dim: int = 4) -> np.ndarray:
    shape = draw(shapes(ndim, max_dim))
    dtype = draw(rarely(st.just("float32"), st.sampled_from(FLOAT_DTYPES), n=5))
    size = int(np.prod(shape, dtype=object))
    if size == 0:
        return np.empty(shape, dtype)
    seed = draw(st.integers(0, 2**32 - 1))
    a = np.random.default_rng(seed).standard_normal(size).astype(np.float32) * 3
    if draw(st.integers(0, 7)) == 4:
        idx = draw(st.integers(0, size - 1))
        with np.errstate(all="ignore"):
            a[idx] = np.float32(draw(st.sampled_from(ODD_FLOATS)))
    a = a.reshape(shape)
    with np.errstate(all="ignore"):
        a = a.astype(dtype)
    if draw(st.integers(0, 14)) == 7 and a.ndim >= 1 and a.shape[-1] > 1:
        a = a[..., ::-1]  # negative stride: bad-shape, never a silent copy
    return a


@st.composite
def id_arrays(draw: Any, shape: tuple[int, ...], vocab: int) -> Any:
    if draw(st.integers(0, 9)) == 5:
        shape = draw(shapes(len(shape)))
    dtype = draw(rarely(st.just("int64"), st.sampled_from(ID_DTYPES), n=5))
    size = int(np.prod(shape, dtype=object))
    if size == 0:
        return np.empty(shape, dtype)
    if size > 256:  # a huge id tensor: a stride-0 view (no memory), refused as non-contiguous
        return np.broadcast_to(np.zeros((), dtype), shape)
    odd = st.sampled_from([-1, vocab, vocab + 3, 2**31 - 1, 2**32 + 5, -(2**40)])
    values = draw(
        st.lists(
            st.one_of(st.integers(0, max(vocab - 1, 0)), odd)
            if draw(st.integers(0, 4)) == 2
            else st.integers(0, max(vocab - 1, 0)),
            min_size=size,
            max_size=size,
        )
    )
    with np.errstate(all="ignore"):
        a = np.array(values, dtype=np.int64).astype(dtype).reshape(shape)
    if draw(st.integers(0, 7)) == 4:
        return a.tolist()  # plain lists go through numpy
    return a


def odd_or(strategy: Any) -> Any:
    """Mostly ``strategy``, sometimes (1 in 10) an odd scalar of any type."""
    return rarely(strategy, st.sampled_from(ODD_SCALARS))


# --- contracts -------------------------------------------------------------------------------


def check_verification(v: Any, b: int, k: int, vocab: int, stops: list[int]) -> None:
    tokens = np.asarray(v.tokens)
    accepted = np.asarray(v.num_accepted)
    assert tokens.shape == (b, k + 1) and tokens.dtype == np.int64
    assert accepted.shape == (b,)
    for r in range(b):
        row = tokens[r]
        n = int(np.argmax(row < 0)) if (row < 0).any() else k + 1
        assert (row[n:] == -1).all(), f"-1 padding must be trailing: {row}"
        assert ((row[:n] >= 0) & (row[:n] < vocab)).all(), f"token outside [0, {vocab}): {row}"
        a = int(accepted[r])
        assert 0 <= a <= k
        ended_on_stop = a > 0 and int(row[a - 1]) in stops
        assert n == a + 1 or (ended_on_stop and n == a), (row, a)
