"""`python -m sapo_node ...` is the same as the `sapo-node` console script."""

import sys

from sapo_node.cli import main

sys.exit(main())
