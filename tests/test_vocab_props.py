"""Properties of the vocabulary contracts (``IdMap``, ``VocabLayout``): hypothesis-generated
sizes, offsets and ids end in a typed error or a map that keeps every id in ``[0, V_t)``.
"""

from __future__ import annotations

import numpy as np
from strategies import PROPS, given, odd_or, outcome, st

import dspark


@PROPS
@given(
    odd_or(st.integers(0, 300)),
    st.lists(st.one_of(st.integers(-5, 305), st.sampled_from([2**32 + 5, 2**63, 2**70, -(2**63)]))),
    st.sampled_from(["list", "int64", "int32", "uint32", "float64"]),
)
def test_idmap_identity(n, ids, kind):
    m = outcome(dspark.IdMap.identity, n)
    if m is None:
        return
    assert m.is_identity and m.target_vocab == n
    if kind != "list":
        with np.errstate(all="ignore"):
            try:
                ids = np.array(ids, dtype=object).astype(kind)
            except OverflowError:
                return
    out = outcome(m.to_target, ids)
    if out is None:
        return
    assert list(out) == [int(i) for i in np.asarray(ids).tolist()]
    assert all(0 <= int(i) < n for i in out)


@PROPS
@given(
    st.lists(st.integers(-300, 300), max_size=40),
    odd_or(st.integers(0, 400)),
    st.lists(st.integers(-2, 420), max_size=8),
)
def test_idmap_offsets(offsets, target_vocab, ids):
    m = outcome(dspark.IdMap.from_offsets, np.array(offsets, np.int64), target_vocab)
    if m is None:
        return
    out = outcome(m.to_target, ids)
    if out is None:
        return
    for d, t in zip(ids, out, strict=True):
        assert t == d + offsets[d] and 0 <= t < target_vocab


@PROPS
@given(odd_or(st.integers(0, 10)), odd_or(st.integers(0, 10)), odd_or(st.integers(0, 10)))
def test_vocab_layout(v_in, v_d, v_t):
    layout = outcome(dspark.VocabLayout, v_in, v_d, v_t)
    if layout is not None:
        assert layout.kind in ("full", "padded", "reduced")
        assert layout.is_reduced == (v_d < v_t)
