"""The swarm pages' figures, of the whole site or of one swarm: nodes online, groups per minute, the
pool's size, totals, the reward curve and per-dataset accuracy (`swarm_overview`), the groups several
nodes trained on (`aha_groups`), swarm against silo (`figures.arms`) and held-out accuracy
(`figures.heldout`). The same functions feed the pages and the JSON API; docs/figures.md says how each
figure is computed.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any

from django.core.cache import cache
from django.db.models import Count, JSONField, OuterRef, Subquery, Sum
from django.utils import timezone

from figures.arms import NodeHourCell, arm_of, compare_arms
from figures.heldout import HeldoutCell, compare_heldout, node_heldout
from figures.leaderboard import FIGURES_CACHE_SECONDS, listed, node_figures_all
from figures.models import DatasetHour, NodeHour
from figures.stats import Measures, active_node_ids, live_rows, measures_of, snapshot
from nodes.models import Node
from nodes.presence import PresenceUnknown, connected_filter
from pool.limits import current_limits
from pool.models import Consumption, HeldoutScore, ModerationStatus, NodeRound, Rollout
from pool.selectors import sample_window
from swarms.models import Swarm
from swarms.scope import SITE, Scope

SWARM_CURVE_HOURS = 48
ACCURACY_DAYS = 7
AHA_RECENT_CONSUMPTIONS = 5000
AHA_MIN_NODES = 2
POOL_COUNT_EXACT_BELOW = 100_000


def _rate(reward: float, completions: int) -> float | None:
    return reward / completions if completions else None


def swarm_overview(*, scope: Scope) -> dict[str, Any]:
    """The swarm page's figures, of the whole site (`Scope.site()`) or of one swarm (cached a few
    seconds)."""
    key = f"figures:swarm:{Scope.check(scope).key()}"
    cached = cache.get(key)
    if cached is None:
        cached = _compute_swarm(timezone.now(), scope)
        cache.set(key, cached, FIGURES_CACHE_SECONDS)
    return cached


#: A node is listed on a swarm's page when its groups or round reports entered that swarm this
#: recently (its nodes online are those whose socket's hello named the swarm: presence records it).
SWARM_ACTIVE_WINDOW = timedelta(minutes=10)


def _swarm_node_ids(swarm_id: int, since: datetime) -> set[int]:
    """Nodes with groups or round reports in the swarm since `since` (index ranges: the groups'
    (swarm_id, created_at) partial index, and the rounds' swarm_id index)."""
    shared = Rollout.objects.filter(swarm_id=swarm_id, created_at__gte=since).values_list("node_id", flat=True)
    reported = NodeRound.objects.filter(swarm_id=swarm_id, updated_at__gte=since).values_list("node_id", flat=True)
    return set(shared.distinct()) | set(reported.distinct())


def _compute_swarm(now: datetime, scope: Scope) -> dict[str, Any]:
    public = [f for f in node_figures_all(scope=SITE) if f.public]
    try:
        online_nodes = Node.objects.filter(
            connected_filter(now=now, scope=scope),
            retired_at__isnull=True,
            banned_at__isnull=True,
            owner__banned_at__isnull=True,
        )
    except PresenceUnknown:  # shown as unknown, not as 0
        online_nodes = None
    recent_window = timedelta(minutes=10)
    recent = Rollout.objects.filter(created_at__gte=now - recent_window)
    if scope.is_site:
        recent = recent.filter(node_id__in=active_node_ids(now - recent_window))
    else:
        # A swarm's figures: its own groups, and the nodes active in it (a node may move between swarms).
        in_swarm = _swarm_node_ids(scope.swarm_id, now - SWARM_ACTIVE_WINDOW)
        public = [f for f in public if f.node_id in in_swarm]
        recent = recent.filter(swarm_id=scope.swarm_id)
    figures = [f for f in public if listed(f)]
    online: int | None = None if online_nodes is None else online_nodes.count()
    recent_groups = recent.count()
    own_window = (
        None
        if scope.is_site
        else Swarm.objects.filter(id=scope.swarm_id).values_list("sample_window_seconds", flat=True).first()
    )
    window = own_window or current_limits().sample_window_seconds
    swarm_ids = list(Swarm.objects.values_list("id", flat=True)) if scope.is_site else [scope.swarm_id]
    pool_size = _pool_size(now - timedelta(seconds=window), swarm_ids)

    curve_start = (now - timedelta(hours=SWARM_CURVE_HOURS)).replace(minute=0, second=0, microsecond=0)
    accuracy_start = now - timedelta(days=ACCURACY_DAYS)
    dataset_hours = scope.rows(DatasetHour.objects.all())
    with snapshot():
        live = live_rows()
        hours = list(dataset_hours.filter(hour__gte=min(curve_start, accuracy_start)))
        node_hours = list(NodeHour.objects.filter(hour__gte=curve_start))
        if scope.is_site:
            accepted = sum(f.accepted for f in public)
            rejected = sum(f.rejected for f in public)
            verified = sum(f.verified_reward for f in public)
        else:  # all time, from the folded hours and the live rows
            totals = dataset_hours.aggregate(
                a=Sum("accepted_groups"), r=Sum("rejected_groups"), v=Sum("verified_reward")
            )
            accepted, rejected, verified = totals["a"] or 0, totals["r"] or 0, totals["v"] or 0.0
            for (s, _, _), m in live.groups.by_dataset_hour.items():
                if s == scope.swarm_id:
                    accepted, rejected, verified = accepted + m.accepted, rejected + m.rejected, verified + m.reward
    per_hour: dict[datetime, Measures] = {}
    per_dataset: dict[str, Measures] = {}
    buckets = [
        (
            h.dataset,
            h.hour,
            measures_of(h),
        )
        for h in hours
    ]
    buckets += [(d, h, m) for (s, d, h), m in live.groups.by_dataset_hour.items() if scope.holds(s)]
    for dataset, hour, m in buckets:
        if hour >= curve_start:
            per_hour.setdefault(hour, Measures()).add(m)
        if hour >= accuracy_start - timedelta(hours=1):
            per_dataset.setdefault(dataset, Measures()).add(m)
    return {
        "generated_at": now,
        "nodes_online": online,
        "nodes_total": len(figures),
        "groups_per_minute": recent_groups / (recent_window.total_seconds() / 60),
        "pool_size": pool_size,
        "pool_window_seconds": window,
        "accepted_groups": accepted,
        "rejected_groups": rejected,
        "acceptance_rate": accepted / (accepted + rejected) if accepted + rejected else None,
        "verified_reward": verified,
        "reward_curve": [
            {"hour": hour, "mean_reward": _rate(m.reward, m.completions), "groups": m.accepted + m.rejected}
            for hour, m in sorted(per_hour.items())
        ],
        "accuracy": [
            {
                "dataset": d,
                "accuracy": _rate(m.reward, m.completions),
                "completions": m.completions,
                "groups": m.accepted + m.rejected,
            }
            for d, m in sorted(per_dataset.items())
        ],
        "aha": aha_groups(scope=scope),
        "arms": _swarm_arms(node_hours, live.groups.by_node_hour, {f.node_id for f in public}, curve_start),
    }


def _swarm_arms(
    node_hours: list[NodeHour], live: dict[tuple[int, datetime], Measures], public: set[int], start: datetime
) -> dict[str, Any]:
    """Swarm against silo over the curve's hours (figures.arms), public nodes only. A node-hour is the
    folded row plus the live rows of the same hour."""
    merged: dict[tuple[int, datetime], Measures] = {}
    for h in node_hours:
        if h.node_id in public:
            merged[(h.node_id, h.hour)] = measures_of(h)
    for (node_id, hour), m in live.items():
        if node_id in public and hour >= start:
            merged.setdefault((node_id, hour), Measures()).add(m)
    cells = [NodeHourCell(node_id, hour, m.reward, m.completions) for (node_id, hour), m in merged.items()]
    return compare_arms(cells, node_arms({node_id for node_id, _ in merged}))


def node_arms(node_ids: set[int]) -> dict[int, str | None]:
    """Each node's arm, from its latest round report (one index probe per node: the subquery reads
    pool_noderound_unique (node, round) backwards, LIMIT 1)."""
    latest = NodeRound.objects.filter(node_id=OuterRef("pk")).order_by("-round").values("figures")[:1]
    rows = Node.objects.filter(id__in=node_ids).annotate(figures=Subquery(latest, output_field=JSONField()))
    return {node_id: arm_of(figures) for node_id, figures in rows.values_list("id", "figures")}


def _pool_size(cutoff: datetime, swarm_ids: Collection[int]) -> int:
    """Sampleable groups inside the window of these swarms. Per swarm, exact (an index count) while
    the window's range of sample numbers is small; above POOL_COUNT_EXACT_BELOW, that range itself: two
    index lookups, an upper bound off by the groups moderated out since (their numbers leave holes)."""
    size = 0
    for swarm_id in swarm_ids:
        window = sample_window(cutoff, swarm_id)
        if window is None:
            continue
        lo, hi = window
        if hi - lo + 1 > POOL_COUNT_EXACT_BELOW:
            size += hi - lo + 1
        else:
            size += Rollout.objects.filter(
                swarm_id=swarm_id, sampleable=True, created_at__gte=cutoff, sample_seq__gte=lo
            ).count()
    return size


def aha_groups(
    *, scope: Scope, limit: int = 10, author_owner_ids: Collection[int] | None = None
) -> list[dict[str, Any]]:
    """Recent groups that several other nodes trained on, most used first (from the latest
    AHA_RECENT_CONSUMPTIONS consumptions: a bounded read of the newest ids), in `scope`;
    `author_owner_ids` keeps the groups of those contributors' nodes (a team's members)."""
    recent = Consumption.objects.order_by("-id").values_list("id", flat=True)[
        AHA_RECENT_CONSUMPTIONS - 1 : AHA_RECENT_CONSUMPTIONS
    ]
    floor = next(iter(recent), 0)
    consumptions = Consumption.objects.filter(id__gte=floor)
    if author_owner_ids is not None:
        consumptions = consumptions.filter(author__owner_id__in=list(author_owner_ids))
    consumptions = scope.rows(consumptions)
    rows = list(
        consumptions.values("rollout_id")
        .annotate(nodes=Count("consumer_id", distinct=True))
        .filter(nodes__gte=AHA_MIN_NODES)
        .order_by("-nodes", "rollout_id")[:limit]
    )
    rollouts = (
        Rollout.objects.filter(id__in=[r["rollout_id"] for r in rows], moderation_status=ModerationStatus.OK)
        .select_related("node", "node__owner")
        .with_texts()
    )
    by_id = {r.id: r for r in rollouts}
    out = []
    for row in rows:
        rollout = by_id.get(row["rollout_id"])
        if rollout is None or rollout.node.is_banned:
            continue
        rewards = rollout.verified_rewards or []
        out.append(
            {
                "id": rollout.id,
                "dataset": rollout.dataset,
                "question": None if rollout.question is None else rollout.question[:200],  # None: aged out
                "node": rollout.node.name,
                "contributor": rollout.node.owner.public_name,
                "nodes_trained": row["nodes"],
                "mean_reward": sum(rewards) / len(rewards) if rewards else None,
                "created_at": rollout.created_at,
            }
        )
    return out


# ---------------------------------------------------------------------------- held-out accuracy

#: A node page's held-out checks shown (its newest).
NODE_HELDOUT_CHECKS = 50


def swarm_heldout(*, swarm: Swarm) -> dict[str, Any]:
    """Held-out accuracy of the swarm's sharing and silo nodes over the last SWARM_CURVE_HOURS hours
    (figures.heldout), public nodes only (cached a few seconds, as the swarm's other figures)."""
    key = f"figures:heldout:{swarm.id}"
    cached = cache.get(key)
    if cached is None:
        since = timezone.now() - timedelta(hours=SWARM_CURVE_HOURS)
        public = {f.node_id for f in node_figures_all() if f.public}
        rows = HeldoutScore.objects.filter(swarm=swarm, answered_at__gte=since, node_id__in=public)
        cells = [HeldoutCell(*r) for r in rows.values_list("node_id", "answered_at", "questions", "score")]
        cached = compare_heldout(cells, node_arms({c.node_id for c in cells}))
        cache.set(key, cached, FIGURES_CACHE_SECONDS)
    return cached


def node_heldout_curve(*, node: Node) -> dict[str, Any]:
    """The node's newest NODE_HELDOUT_CHECKS held-out checks, oldest first, and their accuracy together."""
    rows = list(
        HeldoutScore.objects.filter(node=node)
        .order_by("-answered_at")
        .values_list("node_id", "answered_at", "questions", "score", "round")[:NODE_HELDOUT_CHECKS]
    )[::-1]
    return node_heldout([HeldoutCell(*r[:4]) for r in rows], [r[4] for r in rows])
