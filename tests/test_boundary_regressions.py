"""Issue 14 regressions: every adversarial input it lists gets a typed error or a right answer.

Each test names the class of escape it guards (abort on allocation, panic, silent wrong answer,
untyped exception); each fails if the matching boundary check is reverted.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import dspark
from dspark import _native

B, K, V, R = 2, 3, 10, 4
F32 = np.float32


def _raises(code: str, fn: Any, *args: Any, cls: type = dspark.InputError, **kw: Any) -> Any:
    with pytest.raises(cls) as e:
        fn(*args, **kw)
    assert isinstance(e.value, dspark.DSparkError)
    assert e.value.code == code, f"{e.value.code}: {e.value}"
    return e.value


def block_args(vd: int = V) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(0)
    return (
        rng.standard_normal((B, K, vd)).astype(F32),
        rng.standard_normal((V, R)).astype(F32),
        rng.standard_normal((vd, R)).astype(F32),
        np.array([1, 2], np.int64),
    )


def target_logits(k: int = K) -> np.ndarray:
    return np.random.default_rng(1).standard_normal((B, k + 1, V)).astype(F32)


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
            lambda c: dspark.schedule_lengths(c, [(1, 10.0)]),
            np.empty((2**40, 0), F32),
            "confidence",
        ),
        (
            lambda c: dspark.schedule_pipelined(c, c, [(1, 10.0)]),
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


# --- panics ----------------------------------------------------------------------------------


def test_a_panic_is_a_typed_internal_error():
    e = _raises("internal", _native._test_panic, "boom", cls=dspark.InternalError)
    assert isinstance(e, Exception) and "boom" in str(e)
    assert e.problems == [("internal", str(e))]
    assert dspark.InternalError is _native.InternalError
    assert issubclass(dspark.InternalError, dspark.DSparkError)


def test_error_class_maps_the_new_codes():
    from dspark._errors import error_class

    assert error_class("too-large") is dspark.InputError
    assert error_class("internal") is dspark.InternalError


# --- silent wrong answers --------------------------------------------------------------------


def test_idmap_identity_beyond_the_vocab_limit_is_too_large():
    e = _raises("too-large", dspark.IdMap.identity, 2**33)
    assert "target_vocab" in str(e)


def test_idmap_to_target_never_wraps():
    m = dspark.IdMap.identity(100)
    _raises("token-out-of-range", m.to_target, [2**32 + 5])
    _raises("token-out-of-range", m.to_target, np.array([2**32 + 5], np.int64))
    _raises("token-out-of-range", m.to_target, [2**70])
    assert m.to_target([5, 99]).tolist() == [5, 99]
    assert m.to_target(np.array([1, 2], np.int32)).tolist() == [1, 2]  # any int dtype


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
        (lambda: dspark.IdMap.identity(-1), "invalid-argument"),
        (lambda: dspark.IdMap.identity(2.5), "invalid-argument"),
        (lambda: dspark.IdMap.identity(True), "invalid-argument"),
        (lambda: dspark.IdMap.identity("7"), "invalid-argument"),
        (lambda: dspark.IdMap.identity(2**64), "too-large"),
        (lambda: dspark.IdMap.from_offsets(np.zeros(3, np.int32), -5), "invalid-argument"),
        (lambda: dspark.IdMap.from_offsets([0, "x"], 5), "invalid-argument"),
        (lambda: dspark.IdMap.from_offsets(None, 5), "invalid-argument"),
        (lambda: dspark.VocabLayout(-1, 10, 10), "invalid-argument"),
        (lambda: dspark.VocabLayout(10, 2**40, 10), "too-large"),
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
            lambda: dspark.schedule_lengths(np.ones((B, K), F32), [(1, 5.0)], interpolation=3),
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
        (lambda: dspark.inspect(None), "invalid-argument"),
        (lambda: dspark.inspect(42), "invalid-argument"),
        (lambda: dspark.inspect("x", target=3.5), "invalid-argument"),
        (lambda: dspark.DraftSpec.from_pretrained(None), "invalid-argument"),
        (lambda: _native._dlpack_describe(np.array(["a", "b"])), None),
        (lambda: _native._dlpack_describe(object()), None),
    ],
)
def test_untyped_exceptions_are_typed(call, code):
    with pytest.raises(dspark.DSparkError) as e:
        call()
    if code is not None:
        assert e.value.code == code, f"{e.value.code}: {e.value}"


@pytest.mark.parametrize(
    "config",
    [
        {"block_size": float("nan")},
        {"architectures": ["Qwen3DSparkModel"], "vocab_size": float("inf")},
        {"x": {1, 2}},
        {("a", "b"): 1},
    ],
)
def test_config_dict_that_is_not_json_is_a_config_error(config):
    e = _raises("bad-config", dspark.DraftSpec.from_pretrained, config, cls=dspark.ConfigError)
    assert "<dict>" in str(e)


def test_dlpack_producer_that_raises_is_typed():
    class Bad:
        def __dlpack__(self, **kw: Any) -> Any:
            raise BufferError("nope")

        def __dlpack_device__(self) -> tuple[int, int]:
            return (1, 0)

    e = _raises("invalid-argument", _native._dlpack_describe, Bad())
    assert "nope" in str(e)
    e = _raises("invalid-argument", dspark.verify, target_logits(), Bad())
    assert "draft_tokens" in str(e)


# --- torch tensor kinds ----------------------------------------------------------------------


@pytest.mark.torch
def test_negative_bit_is_resolved_not_ignored():
    torch = pytest.importorskip("torch")
    t = torch.randn(B, K + 1, V)
    drafts = torch.zeros(B, K, dtype=torch.long)
    neg = torch._neg_view(t)
    assert neg.is_neg()
    got = dspark.verify(neg, drafts, temperature=0.0)
    want = dspark.verify(-t, drafts, temperature=0.0)
    assert torch.equal(got.tokens, want.tokens)
    assert not torch.equal(got.tokens, dspark.verify(t, drafts, temperature=0.0).tokens)
    base, w1, w2, anchors = (torch.from_numpy(a) for a in block_args())
    got = dspark.sample_block(torch._neg_view(base), w1, w2, anchors)
    assert torch.equal(got.tokens, dspark.sample_block(-base, w1, w2, anchors).tokens)
    h = torch.randn(B, K, 4)
    c = dspark.confidence(torch._neg_view(h), None, torch.ones(4))
    assert torch.allclose(c, dspark.confidence(-h, None, torch.ones(4)))
    # The native layer, given the raw view, refuses it rather than misreading it.
    _raises("invalid-argument", _native._dlpack_sum, neg)


@pytest.mark.torch
@pytest.mark.parametrize("kind", ["meta", "sparse", "nested", "grad"])
def test_unsupported_torch_tensor_kinds_are_typed(kind):
    torch = pytest.importorskip("torch")
    if kind == "meta":
        t = torch.empty(B, K + 1, V, device="meta")
    elif kind == "sparse":
        t = torch.zeros(B, K + 1, V).to_sparse()
    elif kind == "nested":
        t = torch.nested.nested_tensor([torch.zeros(K + 1, V), torch.zeros(K + 1, V)])
    else:
        t = torch.zeros(B, K + 1, V, requires_grad=True)
    drafts = torch.zeros(B, K, dtype=torch.long)
    if kind == "grad":
        dspark.verify(t, drafts)  # detached by the front: fine
        with pytest.raises(dspark.InputError):
            _native.verify(t, drafts)  # the raw native call: typed, not a RuntimeError
        return
    e = _raises("invalid-argument", dspark.verify, t, drafts)
    assert "target_logits" in str(e)
    with pytest.raises(dspark.InputError):
        _native.verify(t, drafts)
