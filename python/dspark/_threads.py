"""The engine's thread count, fixed once before the native module is first used.

candle-core 0.11 asks for its thread count on every matmul; unless ``RAYON_NUM_THREADS`` is set,
that lookup re-reads ``/proc/cpuinfo`` (``num_cpus::get_physical``), which costs more than the
small matmuls of a drafter round (measured: a bundled-drafter ``propose`` at B = 1 took 2.5 ms
with the variable unset, 1.2 ms with it set). dspark therefore sets it, when the user has not,
to the number of CPUs this process may run on: the same count rayon itself defaults to, so other
rayon users in the process see no change. A count above the CPUs this process may run on (say
``RAYON_NUM_THREADS=100000``, which made a short generation spin up and tear down threads) is
clamped to them, with a warning.
"""

from __future__ import annotations

import os
import warnings

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
    """Set ``RAYON_NUM_THREADS`` if unset (or not a positive integer), clamp it to the CPUs
    this process may run on (warning when it was above them); return its value."""
    current = os.environ.get("RAYON_NUM_THREADS", "").strip()
    cpus = available_cpus()
    if current.isdigit() and int(current) > 0:
        if int(current) <= cpus:
            return int(current)
        warnings.warn(
            f"RAYON_NUM_THREADS={current} is more than the {cpus} CPUs this process may run "
            f"on: dspark uses {cpus}",
            RuntimeWarning,
            stacklevel=3,
        )
    os.environ["RAYON_NUM_THREADS"] = str(cpus)
    return cpus
