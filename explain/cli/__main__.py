"""``python -m explain.cli``."""

import sys

from .parser import main

sys.exit(main())
