"""A contributor or a node withdrawn from what the site publishes: a profile turned private, a ban.

What higher apps derived from a person and published (the statistics export's files) must drop them
at once, not at their next schedule. This app cannot call those apps (they sit above it), so it sends
`withdrawn` after the commit that withdrew them, and they connect to it in their AppConfig.ready()
(figures: figures.export.export_withdraw).
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.dispatch import Signal

logger = logging.getLogger(__name__)

#: Sent after commit with `user_id` (a contributor turned private or banned: their row, their nodes,
#: the teams they founded while banned) or `node_id` (a banned node), the other None.
withdrawn = Signal()


def _send(user_id: int | None, node_id: int | None) -> None:
    for receiver, result in withdrawn.send_robust(sender=None, user_id=user_id, node_id=node_id):
        if isinstance(result, Exception):
            logger.error("withdrawing user %s / node %s: %s failed", user_id, node_id, receiver, exc_info=result)


def contributor_withdrawn_on_commit(*, user_id: int) -> None:
    transaction.on_commit(lambda: _send(user_id, None))


def node_withdrawn_on_commit(*, node_id: int) -> None:
    transaction.on_commit(lambda: _send(None, node_id))
