"""Timing on a torch device, for ``bench_cuda.py``: calls timed with the device synchronized
around each, the columns a row compares with, rows printed as they are measured, and the
device's read bandwidth."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable

import torch


def sync(device: torch.device) -> None:
    """Wait for ``device``'s queued work (nothing on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timeit(fn: Callable[[], object], device: torch.device, *, runs: int, warmup: int = 2) -> float:
    """Median seconds per call (the device synchronized around each call)."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def versus(t_ours: float, t_ref: float, ref: str) -> dict[str, float]:
    """A row's timing columns: dspark's and ``ref``'s milliseconds and the speedup over ``ref``."""
    return {
        "dspark_ms": t_ours * 1e3,
        f"{ref}_ms": t_ref * 1e3,
        f"speedup_vs_{ref}": t_ref / t_ours,
    }


def emit(rows: list[dict], row: dict) -> None:
    """Append ``row`` to ``rows`` and print it as one JSON line (as soon as it is measured)."""
    rows.append(row)
    print(json.dumps(row), flush=True)


def read_bandwidth(device: torch.device, mib: int) -> float:
    """Bytes per second of a full read: best of 5 sums over a ``mib`` MiB float32 tensor."""
    x = torch.ones(mib * 2**20 // 4, device=device)
    best = min(timeit(lambda: x.sum(), device, runs=3, warmup=1) for _ in range(5))
    return x.numel() * 4 / best
