"""``python -m dspark``: the same CLI as the ``dspark`` console script."""

import sys

from dspark.cli import main

sys.exit(main())
