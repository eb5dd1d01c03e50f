"""Inputs changed by another thread during a call: a typed error or a valid result, never a panic.

The kernels release the GIL while they work. The ids of ``verify`` and ``sample_block`` used
to be borrowed from the caller's buffer, checked, then read again: a thread that wrote an
out-of-range id between the check and the read made the engine index out of bounds
(``PanicException``, which ``except Exception`` does not catch). Ids are now copied once, then
validated and used; these tests hammer that window.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import dspark

SECONDS = 1.0


def hammer(call: Callable[[], Any], mutate: Callable[[int], None], check: Callable[[Any], None]):
    """Run ``call`` repeatedly while another thread keeps calling ``mutate(i)``."""
    stop = threading.Event()

    def writer() -> None:
        i = 0
        while not stop.is_set():
            mutate(i)
            i += 1

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    ok = typed = 0
    deadline = time.monotonic() + SECONDS
    try:
        while time.monotonic() < deadline:
            try:
                out = call()
            except dspark.DSparkError as e:
                assert e.code in ("token-out-of-range",), f"{e.code}: {e}"
                typed += 1
                continue
            except BaseException as e:  # PanicException is a BaseException
                pytest.fail(f"{type(e).__name__} escaped: {e}")
            check(out)
            ok += 1
    finally:
        stop.set()
        thread.join()
    assert ok + typed > 0
    return ok, typed


def test_verify_ids_mutated_during_the_call():
    b, k, v = 64, 8, 4096
    rng = np.random.default_rng(0)
    target = rng.standard_normal((b, k + 1, v)).astype(np.float32)
    q = rng.standard_normal((b, k, v)).astype(np.float32)
    drafts = rng.integers(0, v, (b, k)).astype(np.int64)
    good = drafts.copy()
    bad = np.full_like(drafts, 10**12)

    def mutate(i: int) -> None:
        drafts[...] = bad if i % 2 else good

    def check(out: Any) -> None:
        t = out.tokens
        assert t.shape == (b, k + 1)
        assert ((t == -1) | ((t >= 0) & (t < v))).all()

    hammer(lambda: dspark.verify(target, drafts, q, temperature=1.0, seed=1), mutate, check)


def test_sample_block_anchors_mutated_during_the_call():
    b, k, vd, r = 64, 8, 4096, 16
    rng = np.random.default_rng(1)
    base = rng.standard_normal((b, k, vd)).astype(np.float32)
    w1 = rng.standard_normal((vd, r)).astype(np.float32)
    w2 = rng.standard_normal((vd, r)).astype(np.float32)
    anchors = rng.integers(0, vd, b).astype(np.int64)
    good = anchors.copy()

    def mutate(i: int) -> None:
        anchors[...] = -(10**9) if i % 2 else good

    def check(out: Any) -> None:
        assert out.tokens.shape == (b, k)
        assert ((out.tokens >= 0) & (out.tokens < vd)).all()

    hammer(lambda: dspark.sample_block(base, w1, w2, anchors, temperature=0.7), mutate, check)


@pytest.mark.torch
def test_verify_torch_ids_mutated_during_the_call():
    torch = pytest.importorskip("torch")
    b, k, v = 32, 8, 2048
    g = torch.Generator().manual_seed(2)
    target = torch.randn(b, k + 1, v, generator=g)
    drafts = torch.randint(0, v, (b, k), generator=g)
    good = drafts.clone()

    def mutate(i: int) -> None:
        if i % 2:
            drafts.fill_(v + 7)
        else:
            drafts.copy_(good)

    def check(out: Any) -> None:
        t = out.tokens
        assert bool(((t == -1) | ((t >= 0) & (t < v))).all())

    hammer(lambda: dspark.verify(target, drafts), mutate, check)
