"""Old home of the bundled-pair helpers, kept so existing imports keep working.

``import dspark.demo as d; d.bundled_dir()`` was the documented way to find the bundled pair.
The helpers now live by job: the bundled pair in :mod:`dspark.bundled`, the target-only
baseline and the steps-per-second table in :mod:`dspark.measure`; the ``dspark demo`` command
is :mod:`dspark.cli.demo`. New code imports from those modules.
"""

from __future__ import annotations

from dspark.bundled import BundledPair, bundled_dir, heldout_texts, load_pair
from dspark.measure import speculative, steps_per_second, target_only

__all__ = [
    "BundledPair",
    "bundled_dir",
    "heldout_texts",
    "load_pair",
    "speculative",
    "steps_per_second",
    "target_only",
]
