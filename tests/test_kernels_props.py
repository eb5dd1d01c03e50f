"""Properties of the kernels (``verify``, ``sample_block``, ``confidence``, the schedulers):
hypothesis-generated inputs end in a typed error or a result that keeps the documented contract
(tokens in ``[0, V_t)`` or ``-1`` padding after the end, greedy deterministic, confidences in
``[0, 1]``, lengths in ``[0, K]``). The strategies and the outcome rule: ``tests/strategies.py``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from strategies import (
    EXAMPLES,
    ODD_SCALARS,
    PROPS,
    check_verification,
    float_arrays,
    given,
    id_arrays,
    odd_or,
    outcome,
    rarely,
    st,
)

import dspark
from dspark import _native
from helpers import requires_test_hooks


@PROPS
@given(
    st.data(),
    float_arrays(3, max_dim=6),
    odd_or(st.sampled_from([0.0, 0.0, 0.7, 1.0, 1e-30])),
    odd_or(st.sampled_from([None, 1, 3, -1, 2**40])),
    odd_or(st.sampled_from([None, 0.9, 1.0, 1e-3])),
    odd_or(st.integers(0, 2**64 - 1)),
)
def test_verify(data, target, temperature, top_k, top_p, seed):
    b, width, vocab = target.shape if target.ndim == 3 else (1, 1, 1)
    k = max(width - 1, 0)
    drafts = data.draw(id_arrays((b, k), vocab))
    q = None
    if data.draw(st.booleans()):
        small = target.ndim == 3 and b * k * vocab <= 4096
        if small and data.draw(st.integers(0, 4)):
            seed = data.draw(st.integers(0, 2**32 - 1))
            q = np.random.default_rng(seed).standard_normal((b, k, vocab)).astype(np.float32)
        else:
            q = data.draw(float_arrays(3))
    stops = data.draw(
        st.lists(st.integers(0, max(vocab - 1, 0)), max_size=3)
        if data.draw(st.integers(0, 7))
        else st.lists(st.integers(-2, vocab + 2), max_size=3)
    )
    nd = st.lists(st.integers(0, k), min_size=b, max_size=b) if b <= 64 else st.none()
    num_draft = data.draw(
        st.one_of(st.none(), st.none(), nd, st.lists(st.integers(-1, k + 1), max_size=b + 1))
    )
    kw = dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    v = outcome(dspark.verify, target, drafts, q, stop_token_ids=stops, num_draft=num_draft, **kw)
    if v is None:
        return
    check_verification(v, b, k, vocab, stops)
    again = dspark.verify(target, drafts, q, stop_token_ids=stops, num_draft=num_draft, **kw)
    # Counter-based randomness: the same call gives the same answer (greedy and sampled).
    assert np.array_equal(np.asarray(v.tokens), np.asarray(again.tokens))


@PROPS
@given(
    st.data(),
    float_arrays(3, max_dim=5),
    odd_or(st.sampled_from([0.0, 0.0, 0.8, 1.5])),
    odd_or(st.sampled_from([None, None, 1, 2, 100, 2**63])),
    odd_or(rarely(st.just("vd"), st.sampled_from(["vd-1", "vd+1", 2**24, 2**32 - 1]), n=3)),
    odd_or(st.sampled_from([1.0, 1.0, 1.0, 0.5, 0.0, -1.0])),
    odd_or(st.integers(0, 2**64 - 1)),
)
def test_sample_block(data, base, temperature, top_k, target_vocab, logit_scale, seed):
    b, k, vd = base.shape if base.ndim == 3 else (1, 1, 1)
    if isinstance(target_vocab, str) and target_vocab.startswith("vd"):
        target_vocab = {"vd": None, "vd-1": max(vd - 1, 1), "vd+1": vd + 1}[target_vocab]
    rank = data.draw(st.integers(0, 3))
    v_in = data.draw(st.sampled_from([vd, vd, 1, 8])) if vd <= 4096 else 8
    w1 = data.draw(st.one_of(*[st.just(None)] * 5, float_arrays(2)))
    if w1 is None:
        w1 = np.random.default_rng(0).standard_normal((v_in, rank)).astype(np.float32)
    r2 = w1.shape[-1] if w1.ndim and w1.shape[-1] <= 64 else rank
    w2 = (
        np.random.default_rng(1).standard_normal((vd, r2)).astype(np.float32)
        if vd * r2 <= 4096
        else np.empty((vd, 0), np.float32)
    )
    anchors = data.draw(id_arrays((b,), w1.shape[0] if w1.ndim else 1))
    d2t = None
    if (
        isinstance(target_vocab, int)
        and not isinstance(target_vocab, bool)
        and data.draw(st.booleans())
    ):
        d2t = data.draw(id_arrays((vd,), 3))
    kw = dict(
        temperature=temperature,
        top_k=top_k,
        target_vocab_size=target_vocab,
        logit_scale=logit_scale,
        seed=seed,
        d2t=d2t,
    )
    out = outcome(dspark.sample_block, base, w1, w2, anchors, **kw)
    if out is None:
        return
    vt = target_vocab if target_vocab is not None else vd
    vt = int(vt)
    tokens = np.asarray(out.tokens)
    assert tokens.shape == (b, k)
    assert ((tokens >= 0) & (tokens < vt)).all(), f"token outside [0, {vt}): {tokens}"
    assert np.asarray(out.draft_logits).shape == (b, k, vt)
    again = dspark.sample_block(base, w1, w2, anchors, **kw)
    assert np.array_equal(tokens, np.asarray(again.tokens)), "same seed, same block"


@PROPS
@given(
    st.integers(1, 4),
    st.integers(1, 4),
    st.integers(2, 12),
    st.integers(1, 4),
    st.sampled_from([0.0, 0.5, 1.0]),
    st.sampled_from([None, 1, 2, 5, 100]),
    st.integers(0, 2),
    st.integers(0, 2**64 - 1),
)
def test_sample_block_contract(b, k, vd, r, temperature, top_k, extra, seed):
    """Valid inputs only: tokens in ``[0, V_t)``, greedy argmax, the same seed the same block."""
    rng = np.random.default_rng(seed % 2**32)
    base = rng.standard_normal((b, k, vd)).astype(np.float32) * 3
    vt = vd - extra if vd - extra >= 1 else vd  # padded rows [V_t, V_d) are masked
    w1 = rng.standard_normal((vt, r)).astype(np.float32)
    w2 = rng.standard_normal((vd, r)).astype(np.float32)
    anchors = rng.integers(0, vt, b)
    kw = dict(temperature=temperature, top_k=top_k, seed=seed, target_vocab_size=vt)
    out = dspark.sample_block(base, w1, w2, anchors, **kw)
    tokens = np.asarray(out.tokens)
    assert tokens.shape == (b, k) and ((tokens >= 0) & (tokens < vt)).all(), tokens
    q = np.asarray(out.draft_logits)
    assert q.shape == (b, k, vt)
    rows = np.take_along_axis(q, tokens[..., None], axis=-1)[..., 0]
    assert np.isfinite(rows).all(), "a drafted token must lie in its own distribution's support"
    if temperature == 0.0:
        assert (rows == 0.0).all() and (np.isinf(q).sum(-1) == vt - 1).all()
    again = dspark.sample_block(base, w1, w2, anchors, **kw)
    assert np.array_equal(tokens, np.asarray(again.tokens))


@PROPS
@given(
    st.integers(1, 4),
    st.integers(0, 4),
    st.integers(1, 12),
    st.sampled_from([0.0, 0.7, 1.0]),
    st.sampled_from([None, 1, 3]),
    st.sampled_from([None, 0.5, 1.0]),
    st.booleans(),
    st.integers(0, 2**64 - 1),
)
def test_verify_contract(b, k, v, temperature, top_k, top_p, with_q, seed):
    """Valid inputs only: the documented output contract, greedy = target argmax chain."""
    rng = np.random.default_rng(seed % 2**32)
    target = rng.standard_normal((b, k + 1, v)).astype(np.float32) * 2
    drafts = rng.integers(0, v, (b, k))
    if k and b:
        drafts[:, 0] = target[:, 0].argmax(-1)  # some drafts get accepted
    q = rng.standard_normal((b, k, v)).astype(np.float32) if with_q else None
    stops = [int(rng.integers(0, v))]
    kw = dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    out = dspark.verify(target, drafts, q, stop_token_ids=stops, **kw)
    check_verification(out, b, k, v, stops)
    if temperature == 0.0:
        tokens = np.asarray(out.tokens)
        for r in range(b):
            a = int(out.num_accepted[r])
            assert (drafts[r, :a] == target[r, :a].argmax(-1)).all()
            if tokens[r, a] >= 0:
                assert tokens[r, a] == target[r, a].argmax(-1)
    again = dspark.verify(target, drafts, q, stop_token_ids=stops, **kw)
    assert np.array_equal(np.asarray(out.tokens), np.asarray(again.tokens))


@PROPS
@given(
    st.data(),
    float_arrays(3),
    odd_or(st.sampled_from([0.0, 0.5, -2.0])),
    rarely(st.none(), st.lists(st.sampled_from([1.0, 0.5, 0.0, float("nan")])), n=4),
)
def test_confidence(data, hidden, bias, sts):
    h = hidden.shape[-1] if hidden.ndim else 1
    prev = None
    if data.draw(st.booleans()):
        b, k = hidden.shape[:2] if hidden.ndim == 3 else (1, 1)
        r = data.draw(st.integers(0, 3))
        if b * k * r <= 4096 and data.draw(st.integers(0, 4)):
            prev = np.random.default_rng(r).standard_normal((b, k, r)).astype(np.float32)
        else:
            prev = data.draw(float_arrays(3))
    r = prev.shape[-1] if prev is not None and prev.ndim else 0
    n = h + r if h + r <= 4096 else 0
    weight = data.draw(
        rarely(
            st.sampled_from([np.ones(n, np.float32), np.ones((1, n), np.float32)]),
            float_arrays(1) | float_arrays(2),
            n=5,
        )
    )
    c = outcome(dspark.confidence, hidden, prev, weight, bias, sts=sts)
    if c is None:
        return
    c = np.asarray(c)
    assert c.shape == hidden.shape[:2] and c.dtype == np.float32
    assert ((c >= 0) & (c <= 1)).all(), c


@PROPS
@given(
    float_arrays(2),
    odd_or(st.sampled_from([0.5, 0.0, 1.0, -1.0, float("inf")])),
    odd_or(
        rarely(
            st.lists(
                st.tuples(st.integers(1, 64), st.floats(1.0, 100.0)),
                min_size=1,
                max_size=4,
                unique_by=lambda p: p[0],
            ).map(sorted),
            st.lists(st.tuples(st.integers(-1, 64), st.sampled_from([1.0, 0.0, float("nan")])))
            | st.just([[1, 2, 3]]),
            n=5,
        )
    ),
    odd_or(st.sampled_from(["step", "linear"])),
)
def test_schedulers(conf, threshold, table, interpolation):
    b, k = conf.shape if conf.ndim == 2 else (0, 0)
    for lengths in (
        outcome(dspark.schedule_threshold, conf, threshold),
        outcome(dspark.schedule_lengths, conf, table, interpolation),
        outcome(dspark.schedule_lengths, conf, table, interpolation, ahead=conf),
        outcome(dspark.schedule_pipelined, conf, conf, table, interpolation),
    ):
        if lengths is None:
            continue
        assert len(lengths) == b and all(0 <= n <= k for n in lengths), lengths


@requires_test_hooks
@PROPS
@given(float_arrays(3), st.sampled_from(ODD_SCALARS))
def test_raw_native_kernels_take_any_value(target, odd):
    # The natives behind the front: odd values in every slot are typed errors too.
    drafts = (
        np.zeros((target.shape[0], max(target.shape[1] - 1, 0)), np.int64)
        if target.ndim == 3
        else odd
    )
    outcome(_native.verify, target, drafts, odd)
    outcome(_native.verify, target, drafts, temperature=odd, top_k=odd, top_p=odd, seed=odd)
    outcome(_native.verify, target, drafts, num_draft=odd, stop_token_ids=odd)
    outcome(_native.verify, odd, drafts)
    outcome(_native.sample_block, target, odd, odd, odd)
    outcome(_native.confidence, target, odd, odd, odd, sts=odd)
    outcome(_native.schedule_threshold, odd, odd)
    outcome(_native.schedule_lengths, odd, odd, odd)
    outcome(_native._dlpack_describe, odd)


# --- torch: devices and tensor kinds ---------------------------------------------------------

KINDS = ["plain", "neg", "meta", "sparse", "grad", "noncontig", "bf16", "expanded", "channels"]


@pytest.mark.torch
@PROPS
@given(st.sampled_from(KINDS), st.sampled_from(KINDS), st.integers(0, 2**31))
def test_torch_tensor_kinds(kind_t, kind_q, seed):
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(seed)
    b, k, v = 2, 3, 7

    def make(kind: str, *shape: int) -> Any:
        t = torch.randn(*shape, generator=g)
        if kind == "neg":
            return torch._neg_view(t)
        if kind == "meta":
            return t.to("meta")
        if kind == "sparse":
            return t.to_sparse()
        if kind == "grad":
            return t.requires_grad_()
        if kind == "noncontig":
            return torch.randn(*shape[:-1], shape[-1] * 2, generator=g)[..., ::2]
        if kind == "bf16":
            return t.to(torch.bfloat16)
        if kind == "expanded":
            return t[:1].expand(*shape)
        if kind == "channels":
            return t.transpose(0, 1).contiguous().transpose(0, 1)
        return t

    tl, q = make(kind_t, b, k + 1, v), make(kind_q, b, k, v)
    drafts = torch.randint(0, v, (b, k), generator=g)
    out = outcome(dspark.verify, tl, drafts, q, temperature=0.8, seed=3)
    if out is not None:
        check_verification(out, b, k, v, [])
        if kind_t == "neg" and kind_q in ("plain", "bf16"):
            want = dspark.verify(
                -tl._neg_view() if False else tl.resolve_neg(), drafts, q, temperature=0.8, seed=3
            )
            assert torch.equal(out.tokens, want.tokens)
    h = make(kind_t, b, k, 5)
    c = outcome(dspark.confidence, h, None, torch.ones(5))
    if c is not None:
        assert c.shape == (b, k) and bool(((c >= 0) & (c <= 1)).all())


def test_hypothesis_is_derandomized():
    assert PROPS.derandomize and PROPS.max_examples == EXAMPLES
