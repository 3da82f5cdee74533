"""The platform's per-completion text work in C: moderation.filters uses it when it is installed
(`make venv` and the Docker image build it) and its numpy twins otherwise; both give the same results,
bit for bit (tests/platform/test_native.py)."""

from sapo_native._text import char_counts, normalise_ascii, simhashes

__all__ = ["char_counts", "normalise_ascii", "simhashes"]
