"""Test helpers: write drafter checkpoints and configs into temporary directories; expect a
typed error; small seeded kernel inputs."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import dspark
from dspark import _native
from dspark._safetensors import save_file
from dspark.example import draft_config, draft_tensors, target_config

#: The keys of `dspark.build_info()` (the stub's `build_info` return type), for the CPU and the
#: CUDA wheel's tests alike.
BUILD_INFO_KEYS = frozenset(
    {"version", "cuda", "cuda_devices", "cuda_error", "kernel_path", "cpu_kernel", "quant_kernel"}
)

#: The test hooks (`_dlpack_describe`, `_dlpack_sum`, `_test_panic`) exist only in a wheel
#: built with the `test-hooks` feature (scripts/test.sh's test build), not in a release wheel.
HAS_TEST_HOOKS = hasattr(_native, "_test_panic")
#: Where scripts/test.sh unpacked its test build (on PYTHONPATH), or None outside test.sh: there
#: the hooks must be present, so their tests run rather than skip.
TEST_BUILD = os.environ.get("DSPARK_TEST_BUILD") or None
if TEST_BUILD is not None and not HAS_TEST_HOOKS:
    raise RuntimeError(
        f"DSPARK_TEST_BUILD={TEST_BUILD} but {dspark.__file__} has no test hooks: "
        "PYTHONPATH does not put the test build first"
    )
requires_test_hooks = pytest.mark.skipif(
    not HAS_TEST_HOOKS, reason="a release wheel: the test hooks are not compiled in"
)


def write_json(path: Path, value: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value))
    return path


def write_drafter(
    root: Path,
    config: dict[str, Any],
    tensors: dict[str, np.ndarray],
    *,
    shards: int = 1,
) -> Path:
    """Write ``config.json`` and the tensors (one file, or ``shards`` files + index)."""
    root.mkdir(parents=True, exist_ok=True)
    write_json(root / "config.json", config)
    if shards == 1:
        save_file(tensors, root / "model.safetensors")
        return root
    names = list(tensors)
    weight_map: dict[str, str] = {}
    for s in range(shards):
        part = names[s::shards]
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n] for n in part}, root / fname)
        weight_map.update({n: fname for n in part})
    write_json(root / "model.safetensors.index.json", {"metadata": {}, "weight_map": weight_map})
    return root


def example_pair(tmp: Path, layout: str = "padded") -> tuple[Path, Path]:
    """(drafter dir, target dir) for the generated example of ``layout``."""
    target = write_json(tmp / "target" / "config.json", target_config()).parent
    drafter = write_drafter(tmp / "drafter", draft_config(layout), draft_tensors(layout))  # type: ignore[arg-type]
    return drafter, target


def expect_code(
    code: str,
    fn: Callable[..., Any],
    *args: Any,
    cls: type[dspark.DSparkError] = dspark.InputError,
    **kw: Any,
) -> dspark.DSparkError:
    """Call ``fn``: it must raise ``cls`` (a ``DSparkError``) with ``.code == code``; returns
    the error."""
    with pytest.raises(cls) as e:
        fn(*args, **kw)
    assert isinstance(e.value, dspark.DSparkError)
    assert e.value.code == code, f"{e.value.code}: {e.value}"
    return e.value


def random_block_args(
    b: int = 2, k: int = 3, v: int = 10, r: int = 4, vd: int | None = None
) -> tuple[np.ndarray, ...]:
    """Seeded ``sample_block`` inputs: base logits ``[b, k, vd]``, ``W1 [v, r]``, ``W2 [vd, r]``
    (``vd`` defaults to ``v``) and anchors ``1..b``."""
    vd = v if vd is None else vd
    rng = np.random.default_rng(0)
    return (
        rng.standard_normal((b, k, vd)).astype(np.float32),
        rng.standard_normal((v, r)).astype(np.float32),
        rng.standard_normal((vd, r)).astype(np.float32),
        np.arange(1, b + 1, dtype=np.int64),
    )


def random_target_logits(b: int = 2, k: int = 3, v: int = 10) -> np.ndarray:
    """Seeded target logits ``[b, k + 1, v]`` for ``verify``."""
    return np.random.default_rng(1).standard_normal((b, k + 1, v)).astype(np.float32)
