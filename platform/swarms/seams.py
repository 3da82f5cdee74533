"""What the swarms app needs from the layers above it, and the one it uses now.

Swarms sit below nodes, the pool and moderation (docs/architecture.md), yet a staff change to a swarm
is audited and its text screened like any other staff action. `SwarmOversight` is that point of
contact, a typed Protocol with a default that screens nothing and records nothing;
`ModerationConfig.ready()` registers moderation's (moderation.hooks.SWARM_OVERSIGHT), whose audit
entry is written in the service's transaction.
"""

from __future__ import annotations

from typing import Any, Protocol


class SwarmOversight(Protocol):
    def text_screen(self, *, texts: list[str], what: str) -> None:
        """Raise ApplicationError "text_blocked" when the site's text rules refuse one of `texts`."""

    def staff_action_audit(
        self, *, actor: Any, action: str, swarm_id: int, reason: str, details: dict[str, Any]
    ) -> None:
        """Record a staff change of a swarm (inside the caller's transaction)."""


class NoOversight:
    def text_screen(self, *, texts: list[str], what: str) -> None:
        return None

    def staff_action_audit(
        self, *, actor: Any, action: str, swarm_id: int, reason: str, details: dict[str, Any]
    ) -> None:
        return None


_oversight: SwarmOversight = NoOversight()


def oversight_register(implementation: SwarmOversight) -> None:
    global _oversight
    _oversight = implementation


def oversight() -> SwarmOversight:
    return _oversight
