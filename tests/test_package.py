"""Package surface: exception hierarchy, typing markers, stubs in sync with the runtime."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import dspark
import dspark._native as native


def test_exception_hierarchy() -> None:
    for cls in (
        dspark.ConfigError,
        dspark.CheckpointError,
        dspark.VocabError,
        dspark.InputError,
        dspark.BackendError,
        dspark.InternalError,
    ):
        assert issubclass(cls, dspark.DSparkError)
    assert issubclass(dspark.DSparkError, Exception)


def test_errors_carry_code_and_every_problem() -> None:
    with pytest.raises(dspark.VocabError) as info:
        dspark.IdMap.from_offsets(np.array([1, 0, 100], np.int64), 10)
    assert info.value.code == "multiple"
    assert [c for c, _ in info.value.problems] == ["d2t-out-of-range", "d2t-duplicate"]


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


def test_py_typed_and_stubs_match_runtime() -> None:
    pkg = Path(dspark.__file__).parent
    assert (pkg / "py.typed").exists()
    tree = ast.parse((pkg / "_native.pyi").read_text())
    stubbed = {n.name for n in tree.body if isinstance(n, ast.ClassDef | ast.FunctionDef)} | {
        t.id
        for n in tree.body
        if isinstance(n, ast.AnnAssign)
        # Type aliases (`_Tensor: TypeAlias = Any`) exist in the stub only.
        and not (isinstance(n.annotation, ast.Name) and n.annotation.id == "TypeAlias")
        for t in [n.target]
        if isinstance(t, ast.Name)
    }
    public = {n for n in dir(native) if not n.startswith("_")}
    assert {n for n in stubbed if not n.startswith("_")} == public
    # Test hooks and the version are stubbed too, and every stubbed name exists at run time.
    assert all(hasattr(native, n) for n in stubbed)
