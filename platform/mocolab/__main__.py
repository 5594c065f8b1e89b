"""``python -m mocolab``: the same command line as ``mocolab``."""

import sys

from .cli import main

sys.exit(main())
