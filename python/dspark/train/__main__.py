"""``python -m dspark.train``."""

import sys

from dspark.train.pipeline import main

sys.exit(main())
