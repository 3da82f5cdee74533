"""`python -m sapo_node.experiment ...` is the same as `sapo-node experiment ...`."""

import sys

from sapo_node.experiment import main

sys.exit(main())
