import pytest

from pool import ratelimit


@pytest.fixture
def fresh_rate_counts():
    """In-process rate-limit counts start empty (tests reuse node ids across the run)."""
    ratelimit.reset_local()
    yield
    ratelimit.reset_local()
