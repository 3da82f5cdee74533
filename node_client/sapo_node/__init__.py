"""sapo-node: a SAPO swarm node (sample -> generate -> score -> share -> assemble -> GRPO update)."""

__version__ = "0.1.0"
