#!/usr/bin/env python3
"""Train the bundled tiny target + DSpark drafter pair (CPU, seeded, no downloads).

Usage: ``nice -n 19 python scripts/train_tiny.py OUT [--smoke] [--stage target|drafter]``;
the same as ``python -m dspark.train``. Copy ``OUT/target`` and ``OUT/drafter`` into
``python/dspark/models/tiny/`` to bundle them (see ``python/dspark/models/README.md``).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))

from dspark.train.pipeline import main

if __name__ == "__main__":
    sys.exit(main())
