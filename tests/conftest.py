"""Project-wide fixtures. Tests run on real PostgreSQL: DATABASE_URL when set, otherwise the
embedded server (config/embedded_db.py), started on first use and left running.

Each pytest process gets its own test database (`test_<name>_p<pid>`), so several helpers' runs
can share one server at the same time.

Factories live in tests/factories.py (`from factories import make_user, make_node, ...`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `import factories` from any test folder

import factories  # noqa: E402

PASSWORD = factories.DEFAULT_PASSWORD


def pytest_configure(config: pytest.Config) -> None:
    # Tests serve static files from the finders; STATIC_ROOT exists only after collectstatic.
    config.addinivalue_line("filterwarnings", "ignore:No directory at:UserWarning")


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix: None) -> None:
    from django.conf import settings

    for alias in settings.DATABASES:
        db = settings.DATABASES[alias]
        test = db.setdefault("TEST", {})
        base = test.get("NAME") or f"test_{db['NAME']}"
        test["NAME"] = f"{base}_p{os.getpid()}"


@pytest.fixture
def password() -> str:
    return PASSWORD


@pytest.fixture
def user(db):
    return factories.make_user(username="alice", display_name="Alice")


@pytest.fixture
def other_user(db):
    return factories.make_user(username="bob", display_name="Bob")


@pytest.fixture
def node(user):
    """A node of `user`, named "laptop"."""
    return factories.make_node(owner=user, name="laptop")


@pytest.fixture
def node_token(node) -> str:
    """A valid plaintext token of `node`."""
    _, plaintext = factories.make_node_token(node=node)
    return plaintext


@pytest.fixture
def auth_client(client, user):
    """Django's test client, logged in as `user`."""
    client.force_login(user)
    return client


@pytest.fixture
def api_client(user):
    """DRF's APIClient with `user`'s session (CSRF enforced, as for a browser)."""
    from rest_framework.test import APIClient

    api = APIClient()
    api.force_login(user)
    return api
