"""The node's pause gate: named reasons to stop working, which the training loop waits on at its step
and round boundaries (sapo_node.loop).

A reason is a short name: protocol.PAUSE_SITE ("site") is set and cleared by the node's owner from the
site (a `pause` frame, sapo_node.transport.websocket); others (an idle policy: the machine in use, on
battery) add their own. The node works while no reason holds: each reason is cleared by whoever set
it, so the site's resume does not end a pause the machine's policy still wants.

Thread-safe: the transport's thread sets reasons, the training thread waits.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from sapo_node import protocol

#: What the node prints once when a pause for this reason begins (other reasons: "paused (<reason>)").
PAUSE_LINES = {protocol.PAUSE_SITE: "paused from the site (resume on /me/)"}


def pause_line(reasons: frozenset[str]) -> str:
    """The one line that says why the node is paused."""
    return "; ".join(PAUSE_LINES.get(r, f"paused ({r})") for r in sorted(reasons))


class PauseGate:
    def __init__(self) -> None:
        self._reasons: set[str] = set()
        self._changed = threading.Condition()
        #: Called with the reasons after each change (the transport tells the server), outside the lock.
        self.on_change: Callable[[frozenset[str]], None] | None = None

    @property
    def reasons(self) -> frozenset[str]:
        with self._changed:
            return frozenset(self._reasons)

    @property
    def paused(self) -> bool:
        with self._changed:
            return bool(self._reasons)

    def pause(self, reason: str) -> bool:
        """Hold the gate for `reason`. Returns False when it already held it."""
        return self._set(reason, True)

    def resume(self, reason: str) -> bool:
        """Release `reason` (the gate opens once no reason holds it). Returns False when it did not hold."""
        return self._set(reason, False)

    def _set(self, reason: str, held: bool) -> bool:
        if not reason:
            raise ValueError("a pause needs a reason")
        with self._changed:
            if (reason in self._reasons) == held:
                return False
            if held:
                self._reasons.add(reason)
            else:
                self._reasons.discard(reason)
            reasons = frozenset(self._reasons)
            self._changed.notify_all()
        if self.on_change is not None:
            self.on_change(reasons)
        return True

    def wait(
        self,
        *,
        stop: Callable[[], bool] = lambda: False,
        on_pause: Callable[[frozenset[str]], None] | None = None,
        poll: float = 0.5,
    ) -> float:
        """Block while any reason holds, or until `stop()` is true (checked every `poll` seconds).
        `on_pause(reasons)` is called once when the wait begins (not at all when the gate is open).
        Returns the seconds waited."""
        started = time.monotonic()
        with self._changed:
            if not self._reasons:
                return 0.0
            reasons = frozenset(self._reasons)
        if on_pause is not None:
            on_pause(reasons)
        with self._changed:
            while self._reasons and not stop():
                self._changed.wait(poll)
        return time.monotonic() - started
