"""How busy the machine is before a measurement: the share of this process's CPUs that other
processes kept busy over a short window, from ``/proc/stat``. ``dspark demo`` says so when it
is high, since its tokens/s and speedup fall with the load (a busy machine is said, not hidden).
"""

from __future__ import annotations

import time
from pathlib import Path

__all__ = ["BUSY_SHARE", "busy_share", "busy_warning"]

#: The busy share above which the demo warns (a third of the CPUs held by others).
BUSY_SHARE = 0.33


def _cpu_times(stat: Path) -> tuple[int, int] | None:
    """``(busy, total)`` jiffies of all CPUs from ``/proc/stat``'s first line, or ``None``."""
    try:
        first = stat.read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if not first or first[0] != "cpu":
        return None
    try:
        values = [int(v) for v in first[1:]]
    except ValueError:
        return None
    idle = sum(values[3:5])  # idle + iowait
    return sum(values) - idle, sum(values)


def busy_share(window: float = 0.25, stat: Path = Path("/proc/stat")) -> float | None:
    """The share of the machine's CPU time spent busy over ``window`` seconds (this process is
    idle meanwhile, so it is other processes' load); ``None`` where ``/proc/stat`` is not
    readable (not Linux)."""
    before = _cpu_times(stat)
    if before is None:
        return None
    time.sleep(window)
    after = _cpu_times(stat)
    if after is None or after[1] <= before[1]:
        return None
    return max(0.0, min(1.0, (after[0] - before[0]) / (after[1] - before[1])))


def busy_warning(share: float | None, cpus: int) -> str | None:
    """The line to print for a busy share (``None`` below :data:`BUSY_SHARE` or unknown)."""
    if share is None or share < BUSY_SHARE:
        return None
    return (
        f"dspark demo: other processes kept {share:.0%} of the CPUs busy just before this run "
        f"({cpus} CPU{'s' * (cpus != 1)} here): tokens/s and the speedup will be lower than "
        "on a quiet machine (τ and the greedy match are not affected)"
    )
