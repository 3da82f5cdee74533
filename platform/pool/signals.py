"""What the pool announces to the layers above it (they connect in their AppConfig.ready())."""

from __future__ import annotations

from django.dispatch import Signal

#: Sent by pool.services.rollout_set_moderation inside its transaction, just BEFORE the groups'
#: moderation status changes (a receiver can still read the old status). Arguments: `rollouts`, a
#: QuerySet[Rollout] of the groups, and `status`, the new status. Web's folded statistics follow it.
rollouts_moderation_changing = Signal()
