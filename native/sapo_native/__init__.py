"""The platform's per-item loops in C (common.native uses it when it is installed: `make venv` and the
Docker image build it; their Python and numpy twins run otherwise, with the same results, bit for bit:
tests/platform/test_native.py)."""

from sapo_native._text import answers, char_counts, exact_first, near_first, normalise_ascii, pg_array, simhashes

__all__ = ["answers", "char_counts", "exact_first", "near_first", "normalise_ascii", "pg_array", "simhashes"]
