"""Moderation's implementation of the pool's seam (pool.seams.PoolModeration), registered by
ModerationConfig.ready(). The pool never imports this module; it calls it through pool.seams."""

from __future__ import annotations

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
