"""An account as a whole: its owner's data as one JSON document, and its deletion. Here, in web,
because both span every app that holds something of an account (nodes, community, alerts, figures);
each part is read or written by that app's own selector or service.

What deletion does and keeps is docs/community.md, "Your account".
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from accounts.models import User
from accounts.services import user_anonymise
from alerts.selectors import alert_settings_get
from alerts.services import alerts_forget
from community.models import Membership
from community.services import team_membership_close
from figures import leaderboard as boards
from nodes.models import NodeToken
from nodes.selectors import node_list
from nodes.services import node_retire

#: Rows of each list the export holds at most, newest first (retired nodes and rotated tokens pile up
#: over years); `truncated` names the lists that had more.
EXPORT_LIST_LIMIT = 1000
EXPORT_FORMAT = 1

_FIGURES = ("accepted", "rejected", "moderated", "completions", "verified_reward", "helped", "rounds", "recent_credit")


def _at(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def account_data(*, user: User) -> dict[str, Any]:
    """Everything the site keeps about the account that its owner may see, from the selectors /me/ uses.
    Tokens by their shown prefix only: the site has no secret to give (it keeps hashes)."""
    truncated = []
    nodes = list(node_list(owner=user, include_retired=True).order_by("-created_at", "-id")[: EXPORT_LIST_LIMIT + 1])
    if len(nodes) > EXPORT_LIST_LIMIT:
        nodes, truncated = nodes[:EXPORT_LIST_LIMIT], [*truncated, "nodes"]
    figures = boards.node_figures_for(nodes)
    tokens = list(
        NodeToken.objects.filter(node__owner=user)
        .order_by("-created_at", "-id")
        .values("node_id", "prefix", "created_at", "last_used_at", "revoked_at")[: EXPORT_LIST_LIMIT + 1]
    )
    if len(tokens) > EXPORT_LIST_LIMIT:
        tokens, truncated = tokens[:EXPORT_LIST_LIMIT], [*truncated, "tokens"]
    memberships = list(
        Membership.objects.filter(user=user)
        .select_related("team")
        .order_by("-joined_at", "-id")[: EXPORT_LIST_LIMIT + 1]
    )
    if len(memberships) > EXPORT_LIST_LIMIT:
        memberships, truncated = memberships[:EXPORT_LIST_LIMIT], [*truncated, "teams"]
    prefs = alert_settings_get(user=user)
    node_rows = []
    for node in nodes:
        fig = figures[node.id]
        node_rows.append(
            {
                "id": node.id,
                "name": node.name,
                "model_id": node.model_id,
                "hardware": node.hardware,
                "client_version": node.client_version,
                "created_at": _at(node.created_at),
                "last_seen_at": _at(node.last_seen_at),
                "retired_at": _at(node.retired_at),
                "banned_at": _at(node.banned_at),
                **{name: getattr(fig, name) for name in _FIGURES},
            }
        )
    return {
        "format": EXPORT_FORMAT,
        "exported_at": _at(timezone.now()),
        "account": {
            "id": user.id,
            "username": user.username,
            "display_name": user.display_name,
            "email": user.email,
            "email_confirmed_at": _at(user.email_confirmed_at),
            "date_joined": _at(user.date_joined),
            "last_login": _at(user.last_login),
            "profile_private": user.profile_private,
            "banned_at": _at(user.banned_at),
        },
        "totals": {name: sum(row[name] for row in node_rows) for name in _FIGURES},
        "nodes": node_rows,
        "tokens": [
            {
                "node_id": t["node_id"],
                "prefix": t["prefix"],
                "created_at": _at(t["created_at"]),
                "last_used_at": _at(t["last_used_at"]),
                "revoked_at": _at(t["revoked_at"]),
            }
            for t in tokens
        ],
        "teams": [
            {
                "team": m.team.name,
                "slug": m.team.slug,
                "founder": m.team.founder_id == user.id,
                "joined_at": _at(m.joined_at),
                "left_at": _at(m.left_at),
            }
            for m in memberships
        ],
        "alert_settings": {
            "email_alerts": prefs.email_alerts,
            "webhook_url": prefs.webhook_url,
            "silence_minutes": prefs.silence_minutes,
            "min_acceptance": prefs.min_acceptance,
        },
        "truncated": truncated,
    }


@transaction.atomic
def account_delete(*, user: User) -> User:
    """Delete the account (its owner confirmed with the password: the caller's check). Its nodes are
    retired (tokens revoked, open sockets closed after commit), its team membership ends (a team it
    founded passes on or disbands), its alert settings and alerts go, and the row is emptied and made
    anonymous (accounts.services.user_anonymise). The groups its nodes shared stay in the pool, credited
    to "anonymous", so other nodes' training data and the swarm's figures stay whole."""
    for node in node_list(owner=user):
        node_retire(node=node)
    team_membership_close(user=user)
    alerts_forget(user=user)
    return user_anonymise(user=user)
