"""The drafter contract, checked on every drafter class the package provides.

The bug this guards against: one backend lacked ``draft_id_to_target_id``. Every class must
expose every member of ``dspark.protocols.DRAFTER_MEMBERS`` with the same meaning.
"""

from __future__ import annotations

import numpy as np
import pytest
from spec_fixtures import (  # noqa: F401
    VARIANTS,
    checkpoint,
    drafter_classes,
    load_drafter,
    single_thread,
    target,
    torch,
)
from tiny_models import BLOCK, LAYOUTS, TARGET_LAYER_IDS, VOCAB, draft_tensors

from dspark.protocols import DRAFTER_MEMBERS, DrafterProtocol

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("single_thread")]


def _np(x):
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


@pytest.fixture(
    params=[(c, v) for c in drafter_classes() for v in VARIANTS], ids=lambda p: "-".join(p)
)
def case(request, target, checkpoint):
    cls_name, variant = request.param
    return variant, load_drafter(cls_name, checkpoint(variant), target)


def test_every_member_exists(case):
    _, drafter = case
    missing = [m for m in DRAFTER_MEMBERS if not hasattr(drafter, m)]
    assert not missing, f"{type(drafter).__name__} lacks {missing}"
    assert isinstance(drafter, DrafterProtocol)


def test_member_values(case):
    variant, d = case
    kw = VARIANTS[variant]
    v_in, v_d, own_embed, own_lm, reduced = LAYOUTS[kw["layout"]]
    assert (d.block_size, d.noise_token_id) == (BLOCK, v_in - 1)
    assert (d.vocab_size, d.draft_vocab_size, d.target_vocab_size) == (v_in, v_d, VOCAB)
    assert (d.has_own_embed_tokens, d.has_own_lm_head) == (own_embed, own_lm)
    assert list(d.target_layer_ids) == TARGET_LAYER_IDS
    assert list(d.capture_layer_ids) == [i + 1 for i in TARGET_LAYER_IDS]
    assert d.sample_from_anchor is True
    assert d.has_confidence_head is kw.get("confidence", True)
    for name in (
        "has_own_embed_tokens",
        "has_own_lm_head",
        "sample_from_anchor",
        "has_confidence_head",
    ):
        assert isinstance(getattr(d, name), bool), name
    m = d.draft_id_to_target_id
    if reduced:
        assert m is not None and m.dtype in (torch.int64, np.int64)
        want = draft_tensors(kw["layout"])["d2t"]
        np.testing.assert_array_equal(_np(m), want)
    else:
        assert m is None


def test_propose_semantics(case):
    _, d = case
    width = len(d.capture_layer_ids) * 64
    gen = torch.Generator().manual_seed(0)
    ctx = torch.randn(3, 6, width, generator=gen)
    anchors = torch.tensor([1, 50, 200])
    greedy = d.propose(ctx, anchors)
    tokens, q = _np(greedy.tokens), _np(greedy.draft_logits)
    assert tokens.shape == (3, BLOCK) and q.shape == (3, BLOCK, VOCAB)
    assert tokens.min() >= 0 and tokens.max() < VOCAB
    # Greedy q is one-hot at the drafted token.
    np.testing.assert_array_equal(q.argmax(-1), tokens)
    assert np.isneginf(q).sum() == 3 * BLOCK * (VOCAB - 1)
    if d.draft_id_to_target_id is not None:  # reduced: only mapped ids can come out
        mapped = np.arange(d.draft_vocab_size) + _np(d.draft_id_to_target_id)
        assert np.isin(tokens, mapped).all()
    sampled = d.propose(ctx, anchors, temperature=1.0, seed=[1, 2, 3])
    qs = _np(sampled.draft_logits)
    finite = np.isfinite(qs)
    assert finite.sum(-1).max() <= min(d.draft_vocab_size, VOCAB)  # padded rows never appear
    picked = np.take_along_axis(qs, _np(sampled.tokens)[..., None], -1)
    assert np.isfinite(picked).all()
    conf = sampled.confidence
    if d.has_confidence_head:
        c = _np(conf)
        assert c.shape == (3, BLOCK) and ((c > 0) & (c < 1)).all()
    else:
        assert conf is None


def test_stateful_path_matches_stateless(case):
    _, d = case
    width = len(d.capture_layer_ids) * 64
    ctx = torch.randn(2, 5, width, generator=torch.Generator().manual_seed(1))
    states = [d.new_state(), d.new_state()]
    assert states[0].length == 0
    for s, c in zip(states, ctx, strict=True):
        s.extend(c, 0)
    assert [s.length for s in states] == [5, 5]
    a = d.propose_states(states, [3, 4], temperature=0.0, seed=0)
    b = d.propose(ctx, [3, 4])
    np.testing.assert_array_equal(_np(a.tokens), _np(b.tokens))
    if d.has_confidence_head:
        np.testing.assert_allclose(_np(a.confidence), _np(b.confidence), rtol=1e-4, atol=1e-5)
    states[0].truncate(2)
    assert states[0].length == 2
