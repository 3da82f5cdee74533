"""`python -m sapo_node.tiny` (sapo_node.tiny.cli)."""

from sapo_node.tiny.cli import main

main()
