"""Audits: a node's committed weights asked for, uploaded, and replayed by a worker (docs/audits.md)."""
