"""The vocabulary contracts: ``VocabLayout`` (full, padded, reduced) and the draft-to-target
``IdMap`` (identity or a validated ``d2t`` offset table), with their typed errors.
"""

from __future__ import annotations

import numpy as np
import pytest

import dspark
from helpers import expect_code

_raises = expect_code


def test_vocab_layout_and_id_map() -> None:
    assert dspark.VocabLayout(201024, 201024, 200058).kind == "padded"
    assert dspark.VocabLayout(100, 40, 100).is_reduced
    assert dspark.VocabLayout(101, 100, 100).expanded_input
    m = dspark.IdMap.from_offsets(np.array([0, 4, 8], np.int64), 16)
    assert m.kind == "offset-table" and not m.is_identity
    np.testing.assert_array_equal(m.to_target(np.array([2, 0, 1])), [10, 0, 5])
    np.testing.assert_array_equal(m.offsets(), [0, 4, 8])
    with pytest.raises(dspark.InputError) as info:
        m.to_target(np.array([3]))
    assert info.value.code == "token-out-of-range"
    ident = dspark.IdMap.identity(16)
    assert ident.offsets() is None and ident.kind == "identity"


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
    ],
)
def test_untyped_vocab_arguments_are_typed(call, code):
    with pytest.raises(dspark.DSparkError) as e:
        call()
    if code is not None:
        assert e.value.code == code, f"{e.value.code}: {e.value}"
