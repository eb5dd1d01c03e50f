"""The engine's thread count, fixed once before the native module is first used.

candle-core 0.11 asks for its thread count on every matmul; unless ``RAYON_NUM_THREADS`` is set,
that lookup re-reads ``/proc/cpuinfo`` (``num_cpus::get_physical``), which costs more than the
small matmuls of a drafter round (measured: a bundled-drafter ``propose`` at B = 1 took 2.5 ms
with the variable unset, 1.2 ms with it set). dspark therefore sets it, when the user has not,
to the number of CPUs this process may run on: the same count rayon itself defaults to, so other
rayon users in the process see no change.
"""

from __future__ import annotations

import os

__all__ = ["available_cpus", "ensure_rayon_threads"]


def available_cpus() -> int:
    """The number of CPUs this process may run on (its affinity mask; at least 1): the most
    threads worth asking for."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, n)


def ensure_rayon_threads() -> int:
    """Set ``RAYON_NUM_THREADS`` if unset (or not a positive integer); return its value."""
    current = os.environ.get("RAYON_NUM_THREADS", "")
    if current.isdigit() and int(current) > 0:
        return int(current)
    n = available_cpus()
    os.environ["RAYON_NUM_THREADS"] = str(n)
    return n
