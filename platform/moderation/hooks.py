"""Moderation's implementation of the pool's seam (pool.seams.PoolModeration), registered by
ModerationConfig.ready(). The pool never imports this module; it calls it through pool.seams."""

from __future__ import annotations

from typing import Any

from common.errors import ApplicationError
from moderation import screening, trust


class Moderation:
    record_sql = screening.RECORD_SQL
    rollouts_screen = staticmethod(screening.rollouts_screen)
    rollouts_record_part = staticmethod(screening.rollouts_record_part)
    rollouts_recorded = staticmethod(screening.rollouts_recorded)
    sample_keep = staticmethod(trust.sample_keep)
    weighted_pick = staticmethod(trust.weighted_pick)
    node_message_quotas = staticmethod(trust.node_message_quotas)


MODERATION = Moderation()


class SwarmOversight:
    """What moderation does for swarms (swarms.seams.SwarmOversight): a staff change is audited like
    the others, and a swarm's text passes the site's text rules (the blocklist, when on)."""

    def text_screen(self, *, texts: list[str], what: str) -> None:
        from moderation.filters import blocklist_finding
        from moderation.rules import rules_current

        rule = rules_current().get("blocklist")
        if rule is not None and rule.enabled and blocklist_finding(texts, rule) is not None:
            raise ApplicationError("text_blocked", f"This {what} contains words the site does not allow.")

    def staff_action_audit(
        self, *, actor: Any, action: str, swarm_id: int, reason: str, details: dict[str, Any]
    ) -> None:
        from moderation.models import TargetType
        from moderation.services import audit_staff_action

        audit_staff_action(
            actor=actor, action=action, target_type=TargetType.SWARM, target_id=swarm_id, reason=reason, details=details
        )


SWARM_OVERSIGHT = SwarmOversight()
