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

#: What the node prints when a pause for this reason begins (other reasons: "paused (<reason>)").
PAUSE_LINES = {
    protocol.PAUSE_SITE: "paused from the site (resume on /me/)",
    "busy": "paused while the machine is busy (--pause-when-busy)",
    "battery": "paused while on battery (--pause-on-battery)",
}


def pause_line(reasons: frozenset[str], details: dict[str, str] | None = None) -> str:
    """The one line that says why the node is paused; `details` (by reason) adds the figures behind one."""
    details = details or {}
    parts = []
    for r in sorted(reasons):
        line = PAUSE_LINES.get(r, f"paused ({r})")
        parts.append(f"{line}: {details[r]}" if details.get(r) else line)
    return "; ".join(parts)


class PauseGate:
    def __init__(self) -> None:
        self._reasons: set[str] = set()
        self._details: dict[str, str] = {}
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

    @property
    def details(self) -> dict[str, str]:
        """What the holders said of their reasons (the figures behind a pause), by reason."""
        with self._changed:
            return {r: d for r, d in self._details.items() if r in self._reasons}

    def pause(self, reason: str, detail: str = "") -> bool:
        """Hold the gate for `reason` (`detail`: the figures behind it, for the pause line). Returns False
        when it already held it."""
        if detail:
            with self._changed:
                if reason not in self._reasons:
                    self._details[reason] = detail
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
        `on_pause(reasons)` is called when the wait begins and again whenever the reasons holding change
        during it (not at all when the gate is open), outside the lock. Returns the seconds waited."""
        started = time.monotonic()
        told: frozenset[str] = frozenset()
        while True:
            with self._changed:
                if self._reasons and frozenset(self._reasons) == told and not stop():
                    self._changed.wait(poll)
                reasons = frozenset(self._reasons)
            if not reasons or stop():
                break
            if reasons != told:
                told = reasons
                if on_pause is not None:
                    on_pause(reasons)
        return 0.0 if not told else time.monotonic() - started
