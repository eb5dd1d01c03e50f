"""``python -m dspark.cli``: the same as ``python -m dspark``."""

import sys

from dspark.cli import main

sys.exit(main())
