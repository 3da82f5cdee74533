"""Helpers shared by several test modules (no tests here): `from support.pool import make_group`."""
