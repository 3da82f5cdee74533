"""Fixtures for browser tests: a live ASGI server (HTTP and WebSockets, daphne) on the pytest test
database, Debian's chromium driven by Playwright, and small helpers.

    @pytest.mark.browser
    def test_something(live_server, page, user, login, screenshot):
        login(page, user)
        page.goto(live_server.url + "/me/")
        screenshot(page, "me")

- `live_server` (session, defined in tests/conftest.py so tests/integration shares it): daphne in a
  forked process serving config.asgi.application (plus static files from the finders) on 127.0.0.1;
  `.url` is http://127.0.0.1:PORT, `.ws_url` ws://127.0.0.1:PORT. Using it makes the test
  transactional (pytest-django's helper requests `transactional_db`), so rows the test writes are
  visible to the server and the other way round.
- `browser` (one chromium per module) and `page` (a fresh context per test). The chromium is
  $SAPO_CHROMIUM, else `chromium`/`chromium-browser` on PATH, else Playwright's own download;
  `make test` gets one first (.ci/browser).
- `login(page, user)`: a logged-in session cookie for `user` (no form round-trip).
- `screenshot(page, name)`: saves test-artifacts/screenshots/NAME.png (full page).
- `in_thread(fn, *args, **kwargs)`: call sync code on a helper thread and return its result. Needed
  for services that reach the channel layer through `async_to_sync` (pool.ingest.rollout_share
  announces on commit, bans and token revocations close sockets): once Playwright runs, the main
  thread has a running event loop and asgiref refuses `async_to_sync` there.
- `run_async(coro)`: run a coroutine to completion on a fresh loop in another thread (Playwright's
  sync API holds the main thread's loop, so `asyncio.run` fails there). For a node's socket the
  sync client is simplest: `websockets.sync.client.connect(live_server.ws_url + "/ws/node/",
  additional_headers={"Authorization": f"Bearer {token}"})`.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path

import pytest

# Playwright's sync API keeps an asyncio loop on the main thread; Django's ORM then refuses to run
# there unless told that it is safe (it is: the loop is idle while the test's own code runs).
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

REPO = Path(__file__).resolve().parents[2]
SCREENSHOT_DIR = REPO / "test-artifacts" / "screenshots"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Every test in this folder drives a browser or a live server: mark them all.
    for item in items:
        if "tests/browser/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.browser)


# Module scope, not session: Playwright's sync API keeps an event loop running in the main thread
# while it is open, and every async test collected after the browser tests (pytest-asyncio) would
# then fail with "cannot be called from a running event loop".
@pytest.fixture(scope="module")
def _playwright():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        yield playwright


def chromium_path() -> str | None:
    """The chromium to drive (see the module docstring); None means Playwright's own download."""
    explicit = os.environ.get("SAPO_CHROMIUM")
    if explicit:
        return explicit
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def browser(_playwright):
    """One chromium per test module (the machine is small)."""
    from playwright.sync_api import Error

    try:
        browser = _playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
    except Error as exc:
        pytest.fail(f"{exc}\nNo usable chromium: run `bash .ci/browser` (what `make test` does) or set SAPO_CHROMIUM.")
    yield browser
    browser.close()


@pytest.fixture
def page(browser):
    """A fresh browser context (no cookies) and page, desktop-sized."""
    context = browser.new_context(viewport={"width": 1280, "height": 860}, accept_downloads=True)
    context.set_default_timeout(15_000)
    page = context.new_page()
    yield page
    context.close()


@pytest.fixture
def login(live_server) -> Callable:
    """`login(page, user)`: give the page's context a logged-in session for `user`."""
    from django.conf import settings
    from django.test import Client

    def _login(page, user) -> None:
        client = Client()
        client.force_login(user)
        cookie = client.cookies[settings.SESSION_COOKIE_NAME]
        page.context.add_cookies(
            [{"name": settings.SESSION_COOKIE_NAME, "value": cookie.value, "url": live_server.url}]
        )

    return _login


@pytest.fixture
def screenshot() -> Callable:
    """`screenshot(page, name)`: a full-page PNG in test-artifacts/screenshots/; returns its path."""
    SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)

    def _screenshot(page, name: str) -> Path:
        path = SCREENSHOT_DIR / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return _screenshot


def _call_in_thread(fn: Callable, *args, **kwargs) -> object:
    box: dict[str, object] = {}

    def target() -> None:
        from django.db import connections

        try:
            box["result"] = fn(*args, **kwargs)
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc
        finally:
            connections.close_all()  # this thread's own connections

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(300)
    if thread.is_alive():
        raise TimeoutError(f"{fn!r} did not return within 300 s")
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box.get("result")


@pytest.fixture
def in_thread() -> Callable[..., object]:
    """`in_thread(fn, *args, **kwargs)`: fn's result, computed on a helper thread (no event loop)."""
    return _call_in_thread


@pytest.fixture
def run_async() -> Callable[[Coroutine], object]:
    """`run_async(coro)`: its result, computed on a new event loop in a helper thread."""
    return lambda coro: _call_in_thread(asyncio.run, coro)
