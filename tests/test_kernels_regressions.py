"""Kernel inputs that once escaped the boundary checks: each gets a typed error or a right
answer now.

Each test names the class of escape it guards (abort on allocation, silent wrong answer,
untyped exception); each fails if the matching boundary check is reverted.
"""

from __future__ import annotations

import numpy as np
import pytest

import dspark
from dspark import _native
from helpers import expect_code, random_block_args, random_target_logits, requires_test_hooks

B, K, V, R = 2, 3, 10, 4
F32 = np.float32
_raises = expect_code


def block_args(vd: int = V) -> tuple[np.ndarray, ...]:
    return random_block_args(B, K, V, R, vd=vd)


def target_logits(k: int = K) -> np.ndarray:
    return random_target_logits(B, k, V)


# --- aborts on allocation ------------------------------------------------------------------


def test_sample_block_huge_target_vocab_is_too_large():
    # Asked for 34 GB of draft logits; now refused before anything is allocated.
    e = _raises("too-large", dspark.sample_block, *block_args(), target_vocab_size=2**32 - 1)
    assert "target_vocab_size" in str(e)


@pytest.mark.parametrize(
    ("fn", "args", "name"),
    [
        # zero-size inputs with one huge dimension: [2^20, 2^20, 0] hidden -> 2^40 outputs
        (
            lambda h: dspark.confidence(h, None, np.zeros(0, F32)),
            np.empty((2**20, 2**20, 0), F32),
            "hidden",
        ),
        (lambda c: dspark.schedule_threshold(c, 0.5), np.empty((2**40, 0), F32), "confidence"),
        (
            lambda c: dspark.schedule_lengths(c, [(1, 10.0), (2, 10.0)]),
            np.empty((2**40, 0), F32),
            "confidence",
        ),
        (
            lambda c: dspark.schedule_pipelined(c, c, [(1, 10.0), (2, 10.0)]),
            np.empty((2**40, 0), F32),
            "stale",
        ),
    ],
)
def test_zero_size_input_with_huge_dimension_is_too_large(fn, args, name):
    assert args.nbytes == 0
    e = _raises("too-large", fn, args)
    assert name in str(e)


def test_sample_block_zero_size_weight_with_huge_rank_is_too_large():
    base, _, w2, anchors = block_args()
    w1 = np.empty((0, 2**40), F32)  # V_in = 0, r = 2^40: prev_embeddings would be [B, K, 2^40]
    e = _raises("too-large", dspark.sample_block, base, w1, w2, anchors)
    assert "markov_w1" in str(e)


# --- silent wrong answers --------------------------------------------------------------------


def test_verify_refuses_transposed_draft_tokens():
    tl = target_logits(k=B + 1)  # [B, K+1, V] with K = 3 != B = 2
    drafts = np.zeros((B + 1, B), np.int64)  # [K, B]: same count as [B, K]
    e = _raises("bad-shape", dspark.verify, tl, drafts)
    assert "draft_tokens" in str(e)
    dspark.verify(tl, drafts.T.copy())  # the right shape passes


def test_confidence_weight_shape_and_nan():
    h = np.ones((B, K, 4), F32)
    prev = np.ones((B, K, 2), F32)
    _raises("bad-shape", dspark.confidence, h, prev, np.ones((2, 3), F32))  # 6 values, 2-D
    _raises("bad-shape", dspark.confidence, h, None, np.ones((2, 2), F32))
    _raises("bad-shape", dspark.confidence, h, prev, np.ones((6, 1), F32))
    assert dspark.confidence(h, prev, np.ones((1, 6), F32)).shape == (B, K)  # [1, N] linear
    bad = h.copy()
    bad[1, 2, 3] = np.nan
    _raises("non-finite", dspark.confidence, bad, prev, np.ones(6, F32))
    _raises("non-finite", dspark.confidence, h, prev, np.full(6, np.nan, F32))


def test_verify_stop_token_beyond_vocab():
    tl, drafts = target_logits(), np.zeros((B, K), np.int64)
    e = _raises("token-out-of-range", dspark.verify, tl, drafts, stop_token_ids=[V])
    assert "stop_token_ids" in str(e)
    _raises("token-out-of-range", dspark.verify, tl, drafts, stop_token_ids=[-1])
    _raises("token-out-of-range", dspark.verify, tl, drafts, stop_token_ids=[2**64])
    dspark.verify(tl, drafts, stop_token_ids=[V - 1])


def test_num_draft_float_is_refused_not_truncated():
    tl, drafts = target_logits(), np.zeros((B, K), np.int64)
    _raises("invalid-argument", dspark.verify, tl, drafts, num_draft=[2.7, 1])
    _raises("invalid-argument", dspark.verify, tl, drafts, num_draft=[True, 1])


# --- untyped exceptions ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "code"),
    [
        (lambda: dspark.sample_block(*block_args(), top_k=2**64), "too-large"),
        (lambda: dspark.sample_block(*block_args(), top_k=-1), "invalid-argument"),
        (lambda: dspark.sample_block(*block_args(), top_k=2.5), "invalid-argument"),
        (lambda: dspark.sample_block(*block_args(), temperature="hot"), "invalid-argument"),
        (lambda: dspark.sample_block(*block_args(), seed=-1), "invalid-argument"),
        (lambda: dspark.sample_block(*block_args(), seed=2**64), "too-large"),
        (lambda: dspark.sample_block(*block_args(), target_vocab_size=-3), "invalid-argument"),
        (lambda: dspark.verify(target_logits(), None), "invalid-argument"),
        (lambda: dspark.verify(None, np.zeros((B, K), np.int64)), "invalid-argument"),
        (lambda: dspark.verify(target_logits(), [[0, 1], [2]]), "invalid-argument"),
        (lambda: dspark.verify(target_logits(), np.zeros((B, K))), "unsupported-dtype"),
        (lambda: dspark.verify(target_logits(), np.zeros((B, K), bool)), "unsupported-dtype"),
        (lambda: dspark.verify(target_logits(), "abc"), "invalid-argument"),
        (
            lambda: dspark.verify(target_logits(), np.zeros((B, K), np.int64), top_k=2**64),
            "too-large",
        ),
        (
            lambda: dspark.verify(target_logits(), np.zeros((B, K), np.int64), temperature="x"),
            "invalid-argument",
        ),
        (
            lambda: dspark.verify(target_logits(), np.zeros((B, K), np.int64), top_p=[0.5, None]),
            "invalid-argument",
        ),
        (
            lambda: dspark.verify(target_logits(), np.zeros((B, K), np.int64), seed=[1.5, 2]),
            "invalid-argument",
        ),
        (lambda: dspark.schedule_threshold(np.ones((B, K), F32), "x"), "invalid-argument"),
        (lambda: dspark.schedule_threshold(np.ones((B, K), F32), float("nan")), None),
        (lambda: dspark.schedule_lengths(np.ones((B, K), F32), [(-1, 5.0)]), "invalid-argument"),
        (lambda: dspark.schedule_lengths(np.ones((B, K), F32), [("a", 5.0)]), "invalid-argument"),
        (lambda: dspark.schedule_lengths(np.ones((B, K), F32), 5), "invalid-argument"),
        (
            lambda: dspark.schedule_lengths(
                np.ones((B, K), F32), [(1, 5.0), (2, 5.0)], interpolation=3
            ),
            "invalid-argument",
        ),
        (lambda: dspark.confidence(np.ones((B, K, 2), F32), None, np.ones(2, F32), "b"), None),
        (
            lambda: dspark.confidence(np.ones((B, K, 2), F32), None, np.ones(2, F32), sts=5),
            "invalid-argument",
        ),
        (
            lambda: dspark.confidence(np.ones((B, K, 2), F32), None, np.ones(2, F32), sts=["x"]),
            "invalid-argument",
        ),
        pytest.param(
            lambda: _native._dlpack_describe(np.array(["a", "b"])), None, marks=requires_test_hooks
        ),
        pytest.param(lambda: _native._dlpack_describe(object()), None, marks=requires_test_hooks),
    ],
)
def test_untyped_exceptions_are_typed(call, code):
    with pytest.raises(dspark.DSparkError) as e:
        call()
    if code is not None:
        assert e.value.code == code, f"{e.value.code}: {e.value}"
