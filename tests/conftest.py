"""Shared pytest fixtures and helpers (generic: no test-file-specific logic here)."""

from __future__ import annotations

import sys
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

# Make `tests/helpers.py` importable as `helpers` from every test module.
sys.path.insert(0, str(Path(__file__).parent))

#: Significance level of every statistical test: tight, so a correct kernel never flakes.
ALPHA = 1e-4


def stable_seed(*parts: object) -> int:
    """A deterministic 32-bit seed derived from the parts' text (stable across runs/processes)."""
    return zlib.crc32(repr(parts).encode())


def _cuda_skip_reason() -> str | None:
    """Why ``cuda``-marked tests cannot run here, or ``None`` when they can.

    ``DSPARK_CUDA_TEST_DEVICE=cpu`` runs them on the CPU: a dry run of the tests themselves.
    """
    import os

    import dspark

    if os.environ.get("DSPARK_CUDA_TEST_DEVICE", "cuda") == "cpu":
        return None

    if dspark.build_info()["cuda_devices"] == 0:
        return "needs the CUDA wheel and a CUDA device (build_info reports none)"
    try:
        import torch
    except ImportError:
        return "needs torch with CUDA (torch is not installed)"
    if not torch.cuda.is_available():
        return "needs torch with CUDA (torch.cuda.is_available() is False)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``cuda``-marked tests cleanly where there is no CUDA device or CUDA torch."""
    marked = [item for item in items if item.get_closest_marker("cuda") is not None]
    if not marked:
        return
    reason = _cuda_skip_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in marked:
        item.add_marker(skip)


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """A numpy generator seeded from the test's node id: deterministic per test."""
    return np.random.default_rng(stable_seed(request.node.nodeid))


def check_distribution(
    samples: np.ndarray, probs: np.ndarray, *, alpha: float = ALPHA, what: str = "samples"
) -> float:
    """Chi-square goodness of fit of integer ``samples`` in ``[0, len(probs))`` to ``probs``.

    Cells with zero expected probability must be empty; the rest are tested at ``alpha``.
    Returns the p-value.
    """
    from scipy import stats

    samples = np.asarray(samples).reshape(-1)
    probs = np.asarray(probs, dtype=np.float64)
    n = samples.size
    assert n > 0, f"{what}: no samples"
    assert samples.min() >= 0 and samples.max() < probs.size, f"{what}: sample out of range"
    counts = np.bincount(samples, minlength=probs.size)
    zero = probs <= 0
    assert counts[zero].sum() == 0, (
        f"{what}: {counts[zero].sum()} samples at zero-probability ids "
        f"{np.nonzero(zero & (counts > 0))[0]}"
    )
    live = ~zero
    if live.sum() == 1:
        return 1.0
    expected = probs[live] / probs[live].sum() * n
    observed = counts[live]
    # Pool the cells expected to hold fewer than 5 samples into one (chi-square needs >= 5).
    small = expected < 5
    if small.any():
        expected = np.append(expected[~small], expected[small].sum())
        observed = np.append(observed[~small], observed[small].sum())
    if expected.size == 1:
        return 1.0
    p_value = float(stats.chisquare(observed, expected).pvalue)
    assert p_value > alpha, (
        f"{what}: chi-square p={p_value:.3g} (n={n})\nobserved={observed}\n"
        f"expected={np.round(expected, 1)}"
    )
    return p_value


@pytest.fixture
def assert_distribution() -> Callable[..., float]:
    """The :func:`check_distribution` helper as a fixture."""
    return check_distribution


@pytest.fixture(scope="session")
def bundled_pair() -> tuple[Any, Any]:
    """The bundled pair, loaded once: its ``NativeTarget`` and ``Drafter`` (no calibration)."""
    import dspark
    from dspark.bundled import bundled_dir

    root = bundled_dir()
    target = dspark.NativeTarget.from_pretrained(root / "target")
    return target, dspark.Drafter.from_pretrained(root / "drafter", target, sts=False)


@pytest.fixture(scope="session")
def bundled_server() -> Iterator[Any]:
    """One ``dspark serve`` on the bundled pair (``test_serve.Server``) for the session's
    client tests."""
    from test_serve import Server

    s = Server()
    yield s
    s.stop()
