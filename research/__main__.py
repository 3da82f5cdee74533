"""`python -m research ...`, from the repository root (research/__init__.py)."""

import sys

from research import main

sys.exit(main())
