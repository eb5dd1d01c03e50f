"""``RAYON_NUM_THREADS`` is fixed at import: candle re-reads /proc/cpuinfo per matmul otherwise."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dspark._threads import ensure_rayon_threads


def _allowed() -> int:
    return len(os.sched_getaffinity(0))


def test_unset_gets_the_cpus_this_process_may_use(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
    assert ensure_rayon_threads() == _allowed()
    assert os.environ["RAYON_NUM_THREADS"] == str(_allowed())


def test_a_user_value_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAYON_NUM_THREADS", "1")
    assert ensure_rayon_threads() == 1
    assert os.environ["RAYON_NUM_THREADS"] == "1"


def test_more_threads_than_cpus_are_clamped_with_a_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``RAYON_NUM_THREADS=100000`` made a short generation spin threads up and down."""
    monkeypatch.setenv("RAYON_NUM_THREADS", "100000")
    with pytest.warns(RuntimeWarning, match="100000"):
        assert ensure_rayon_threads() == _allowed()
    assert os.environ["RAYON_NUM_THREADS"] == str(_allowed())


@pytest.mark.parametrize("bad", ["", "0", "two", "-1"])
def test_unusable_values_are_replaced(monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    monkeypatch.setenv("RAYON_NUM_THREADS", bad)
    assert ensure_rayon_threads() == _allowed()
    assert os.environ["RAYON_NUM_THREADS"] == str(_allowed())


def test_importing_dspark_sets_it() -> None:
    env = {k: v for k, v in os.environ.items() if k != "RAYON_NUM_THREADS"}
    code = "import os, dspark; print(os.environ['RAYON_NUM_THREADS'])"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == str(_allowed())
