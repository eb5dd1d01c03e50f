"""Package surface: the exception hierarchy, codes and panics at the boundary (the stub against
the extension: ``test_stubs.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import dspark
from dspark import _native
from helpers import TEST_BUILD, expect_code, requires_test_hooks


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


@pytest.mark.skipif(TEST_BUILD is None, reason="only under scripts/test.sh's test build")
def test_the_installed_package_is_the_release_build() -> None:
    """scripts/test.sh imports its test build (hooks compiled in) from PYTHONPATH; the
    environment's installed dspark, the one the main job and users run, has no hooks."""
    assert TEST_BUILD is not None
    assert Path(dspark.__file__).resolve().is_relative_to(Path(TEST_BUILD).resolve())
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DSPARK_TEST_BUILD")}
    code = "import dspark, dspark._native as n; print(dspark.__file__, hasattr(n, '_test_panic'))"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    where, hooks = out.stdout.split()
    assert hooks == "False", out.stdout
    assert not Path(where).resolve().is_relative_to(Path(TEST_BUILD).resolve()), where


@requires_test_hooks
def test_a_panic_is_a_typed_internal_error():
    e = expect_code("internal", _native._test_panic, "boom", cls=dspark.InternalError)
    assert isinstance(e, Exception) and "boom" in str(e)
    assert e.problems == [("internal", str(e))]
    assert dspark.InternalError is _native.InternalError
    assert issubclass(dspark.InternalError, dspark.DSparkError)


def test_error_class_maps_the_new_codes():
    from dspark._errors import error_class

    assert error_class("too-large") is dspark.InputError
    assert error_class("internal") is dspark.InternalError


def test_every_engine_error_code_is_documented():
    """Every code `dspark::Error::code()` can return is in the table of docs/errors.md."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    source = (root / "crates/dspark-contracts/src/error.rs").read_text()
    body = source[source.index("pub fn code(&self)") :]
    body = body[: body.index("\n    }\n")]
    codes = set(re.findall(r'=> "([a-z0-9-]+)"', body))
    assert len(codes) > 20
    table = (root / "docs/errors.md").read_text().split("## Size limits")[0]
    documented = set(re.findall(r"`([a-z0-9-]+)`", table))
    assert codes <= documented, sorted(codes - documented)
