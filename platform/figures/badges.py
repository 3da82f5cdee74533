"""Badges, assigned by the scheduled job `badges` (ops.scheduled): docs/community.md#badges.

Rank badges follow BOINC's rule (html/ops/badge_assign.php): among *active* subjects (recent credit
above ACTIVE_RECENT_CREDIT), the threshold of the top p% is the recent credit found at position
floor(n * (100 - p) / 100) of their recent credits in ascending order; every subject with any credit
holds the best rank badge whose threshold it reaches, and no other. Recomputed on every run: a
subject that falls behind loses it. Milestones are awarded once and kept.

Only *established* subjects rank, in the percentiles and for the badges: an account (a team) at least
BADGE_MIN_AGE old with at least BADGE_MIN_VERIFIED_REWARD verified reward in all. Otherwise cheap
accounts, each just above the activity line, would fill the bottom of the percentiles and push real
contributors into higher badges; each such account must first exist for BADGE_MIN_AGE and earn its
floor of verified work.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from accounts.models import User
from community.models import MILESTONE_BADGES, RANK_BADGES, Badge, BadgeKind
from figures.leaderboard import contributor_figures_all
from figures.teams import team_figures_all
from swarms.models import Swarm
from swarms.scope import SITE, Scope
from swarms.selectors import swarm_list

#: Recent credit (verified reward per day) above which a subject counts in the percentiles.
ACTIVE_RECENT_CREDIT = 0.1
#: An account or team this young, or with less verified reward in all, holds no rank badge and does
#: not count in the percentiles (docs/community.md#badges).
BADGE_MIN_AGE = timedelta(days=14)
BADGE_MIN_VERIFIED_REWARD = 20.0
RANK_PERCENTS = ((BadgeKind.TOP_1, 1), (BadgeKind.TOP_5, 5), (BadgeKind.TOP_25, 25))
MILESTONE_GROUPS = ((BadgeKind.FIRST_GROUP, 1), (BadgeKind.GROUPS_1K, 1_000), (BadgeKind.GROUPS_10K, 10_000))


def rank_thresholds(recent_credits: Sequence[float]) -> list[tuple[str, float]]:
    """(badge, threshold) best first, from the active subjects' recent credits; empty when none is active."""
    active = sorted(c for c in recent_credits if c > ACTIVE_RECENT_CREDIT)
    if not active:
        return []
    n = len(active)
    return [(kind, active[n * (100 - percent) // 100]) for kind, percent in RANK_PERCENTS]


def rank_badges(subjects: dict[int, tuple[float, float]]) -> dict[int, str]:
    """subject id -> its rank badge, from {id: (total verified reward, recent credit)}."""
    thresholds = rank_thresholds([recent for _, recent in subjects.values()])
    out = {}
    for subject, (total, recent) in subjects.items():
        if total <= 0:
            continue
        for kind, threshold in thresholds:
            if recent >= threshold:
                out[subject] = kind
                break
    return out


def established(subjects: dict[int, tuple[float, float]], since: dict[int, datetime], now: datetime) -> dict:
    """The subjects that rank: at least BADGE_MIN_AGE old (`since`: account joined, team founded) with at
    least BADGE_MIN_VERIFIED_REWARD verified reward in all."""
    oldest = now - BADGE_MIN_AGE
    return {
        subject: figures
        for subject, figures in subjects.items()
        if figures[0] >= BADGE_MIN_VERIFIED_REWARD and subject in since and since[subject] <= oldest
    }


def _apply(holder: str, ranks: dict[int, str], milestones: Iterable[tuple[int, str]], scope: Scope) -> tuple[int, int]:
    """Make the rank badges of `holder` ("user" or "team") of the whole site, or of one swarm (`scope`),
    exactly `ranks`, and add the milestones. Returns (rank badges now held, milestones newly awarded). A fixed
    number of statements."""
    held = {
        (getattr(b, f"{holder}_id"), b.kind): b.id
        for b in Badge.objects.filter(
            **{f"{holder}__isnull": False},
            **({"swarm__isnull": True} if scope.is_site else {"swarm_id": scope.swarm_id}),
            kind__in=list(RANK_BADGES) + list(MILESTONE_BADGES),
        )
    }
    wanted_ranks = set(ranks.items())
    stale = [
        badge_id
        for (subject, kind), badge_id in held.items()
        if kind in RANK_BADGES and (subject, kind) not in wanted_ranks
    ]
    new = [(subject, kind) for subject, kind in wanted_ranks if (subject, kind) not in held]
    new_milestones = [(s, k) for s, k in set(milestones) if (s, k) not in held]
    with transaction.atomic():
        Badge.objects.filter(id__in=stale).delete()
        Badge.objects.bulk_create(
            [
                Badge(**{f"{holder}_id": subject}, kind=kind, swarm_id=None if scope.is_site else scope.swarm_id)
                for subject, kind in new + new_milestones
            ],
            ignore_conflicts=True,
        )
    return len(wanted_ranks), len(new_milestones)


def _swarm_ranks(swarm: Swarm, joined: dict[int, datetime], founded: dict[int, datetime], now: datetime) -> int:
    """Make the rank badges earned in `swarm` exactly those its figures give (the same rule, on the
    contributors' and teams' figures in that swarm; established as on the whole site). Returns how
    many are held."""
    scope = Scope.swarm(swarm.id)
    contributors = contributor_figures_all(scope=scope)
    ranks = rank_badges(
        established({c.owner_id: (c.verified_reward, c.recent_credit) for c in contributors}, joined, now)
    )
    teams = team_figures_all(scope=scope)
    team_ranks = rank_badges(
        established({t.team_id: (t.verified_reward, t.recent_credit) for t in teams}, founded, now)
    )
    return _apply("user", ranks, [], scope)[0] + _apply("team", team_ranks, [], scope)[0]


def badges_assign() -> dict[str, tuple[int, int]]:
    """Assign every badge now: {"contributors": (rank badges, new milestones), "teams": (...),
    "swarms": (rank badges held in swarms, 0)}. Swarms have rank badges of their own when the site has
    more than one (with one, they would be the site's)."""
    now = timezone.now()
    contributors = contributor_figures_all(scope=SITE)
    joined = dict(User.objects.filter(id__in=[c.owner_id for c in contributors]).values_list("id", "date_joined"))
    ranks = rank_badges(
        established({c.owner_id: (c.verified_reward, c.recent_credit) for c in contributors}, joined, now)
    )
    milestones = [(c.owner_id, kind) for c in contributors for kind, n in MILESTONE_GROUPS if c.accepted >= n]
    milestones += [(c.owner_id, BadgeKind.FIRST_HELPED) for c in contributors if c.helped > 0]
    result = {"contributors": _apply("user", ranks, milestones, SITE)}
    teams = team_figures_all(scope=SITE)
    founded = {t.team_id: t.created_at for t in teams if t.created_at is not None}
    team_ranks = rank_badges(
        established({t.team_id: (t.verified_reward, t.recent_credit) for t in teams}, founded, now)
    )
    result["teams"] = _apply("team", team_ranks, [], SITE)
    swarms = swarm_list()
    in_swarms = sum(_swarm_ranks(s, joined, founded, now) for s in swarms) if len(swarms) > 1 else 0
    result["swarms"] = (in_swarms, 0)
    return result


def badges_assign_job() -> str:
    """The scheduled job: its log line."""
    result = badges_assign()
    (c_rank, c_new), (t_rank, _), (s_rank, _) = result["contributors"], result["teams"], result["swarms"]
    return (
        f"contributors: {c_rank} rank badges, {c_new} new milestones; teams: {t_rank} rank badges; "
        f"swarms: {s_rank} rank badges"
    )
