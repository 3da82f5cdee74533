"""The credit rule and the recent-credit decay, defined here and nowhere else (docs/figures.md).

A group is *credited* when the verifier accepted it, moderation has not taken it out (quarantined or
rejected) and a passed audit covered it (`audit_state` audited: docs/audits.md); its *reward* is the
sum of its verified rewards. *Recent credit* weighs each credited
reward by 2^((t - CREDIT_EPOCH) / CREDIT_HALF_LIFE) when it is summed (its *growth*), so a sum kept
for years decays by one multiplication when read (`recent_average_credit`).

Every statistic reads these through the SQL fragments below (psycopg's `sql` module, over a pool row
alias, `r` unless named) or through their Python twins, which are derived from the same constants.
tests/test_credit_once.py fails when a second definition appears elsewhere in platform/.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from psycopg import sql

from pool.models import ModerationStatus, Verdict

ACCEPTED: str = Verdict.ACCEPTED.value
REJECTED: str = Verdict.REJECTED.value
#: Moderation statuses that take an accepted group's credit away.
MODERATED_OUT: tuple[str, ...] = (ModerationStatus.QUARANTINED.value, ModerationStatus.REJECTED.value)
#: The audit state of a group whose work a passed audit proved (pool.models.AuditState).
AUDITED = "audited"
#: G of the group-worth bound: a group of n completions earns its verified rewards' sum times
#: min(1, G / n), so a group of more completions than the swarm's G earns no more than one of G
#: (SAPO_CREDIT_COMPLETIONS, read once at start).
CREDIT_COMPLETIONS: int = settings.SAPO_CREDIT_COMPLETIONS
CREDIT_HALF_LIFE = timedelta(days=7)
#: Reference time of the growth (2^((t - epoch) / half-life) stays finite until about 2045;
#: `manage.py sapo_stats rebuild` with a later epoch then).
CREDIT_EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
LN2 = math.log(2.0)


# ---------------------------------------------------------------------------- SQL


def credited(alias: str = "r") -> sql.Composed:
    """The credited-group predicate over a pool_rollout row."""
    r = sql.Identifier(alias)
    return sql.SQL(
        "({r}.verdict = {accepted} AND {r}.moderation_status NOT IN ({out}) AND {r}.audit_state = {audited})"
    ).format(
        r=r,
        accepted=sql.Literal(ACCEPTED),
        out=sql.SQL(", ").join(sql.Literal(s) for s in MODERATED_OUT),
        audited=sql.Literal(AUDITED),
    )


def reward(alias: str = "r") -> sql.Composed:
    """A group's reward: the sum of its verified rewards (0 when they are not a JSON array) times
    min(1, CREDIT_COMPLETIONS / its completion count), the group-worth bound."""
    return sql.SQL(
        "((SELECT coalesce(sum(x::float8), 0) FROM jsonb_array_elements_text("
        "CASE WHEN jsonb_typeof({r}.verified_rewards) = 'array' THEN {r}.verified_rewards ELSE '[]' END) AS x)"
        " * least(1.0::float8, {g}::float8 / greatest({r}.completion_count, 1)))"
    ).format(r=sql.Identifier(alias), g=sql.Literal(CREDIT_COMPLETIONS))


def growth(value: sql.Composable, at: sql.Composable) -> sql.Composed:
    """The decay's weight applied to `value` earned at `at`. In float8: extract() gives numeric, whose
    power() costs about 40 times as much (docs/figures.md, "Cost")."""
    return sql.SQL("{value} * power(2.0::float8, extract(epoch FROM {at} - {epoch})::float8 / {half_life})").format(
        value=value,
        at=at,
        epoch=sql.Literal(CREDIT_EPOCH),
        half_life=sql.Literal(CREDIT_HALF_LIFE.total_seconds()),
    )


def credit_lateral(alias: str = "r") -> sql.Composed:
    """`CROSS JOIN LATERAL (...) c` giving each row of `alias` c.credited and c.reward, for MEASURES."""
    return sql.SQL("CROSS JOIN LATERAL (SELECT {credited} AS credited, {reward} AS reward) c").format(
        credited=credited(alias), reward=reward(alias)
    )


def _measure_sql() -> dict[str, sql.Composed]:
    r, accepted = sql.Identifier("r"), sql.Literal(ACCEPTED)
    return {
        "accepted": sql.SQL("count(*) FILTER (WHERE {r}.verdict = {a})").format(r=r, a=accepted),
        "rejected": sql.SQL("count(*) FILTER (WHERE {r}.verdict = {x})").format(r=r, x=sql.Literal(REJECTED)),
        "moderated": sql.SQL("count(*) FILTER (WHERE {r}.verdict = {a} AND NOT c.credited)").format(r=r, a=accepted),
        "completions": sql.SQL("coalesce(sum({r}.completion_count) FILTER (WHERE c.credited), 0)").format(r=r),
        "reward": sql.SQL("coalesce(sum(c.reward) FILTER (WHERE c.credited), 0)"),
        "growth": sql.SQL("coalesce(sum({g}) FILTER (WHERE c.credited), 0)").format(
            g=growth(sql.SQL("c.reward"), sql.SQL("{r}.created_at").format(r=r))
        ),
    }


#: Each additive figure of a set of groups, as an aggregate over `pool_rollout r` + `credit_lateral()`.
MEASURE_SQL = _measure_sql()


def measures(names: Sequence[str]) -> sql.Composed:
    """The select list of these figures (names of MEASURE_SQL), each `AS` its name."""
    return sql.SQL(", ").join(sql.SQL("{} AS {}").format(MEASURE_SQL[name], sql.Identifier(name)) for name in names)


# ---------------------------------------------------------------------------- Python twins


def is_credited(verdict: str, moderation_status: str, audit_state: str) -> bool:
    """`credited()` for a row already in memory."""
    return verdict == ACCEPTED and moderation_status not in MODERATED_OUT and audit_state == AUDITED


def group_reward(verified_rewards: Any, completion_count: int) -> float:
    """`reward()` for a row already in memory."""
    total = sum(float(x) for x in verified_rewards) if isinstance(verified_rewards, list) else 0.0
    return total * min(1.0, float(CREDIT_COMPLETIONS) / max(completion_count, 1))


def growth_of(value: float, at: datetime) -> float:
    """`growth()` for a value already in memory."""
    return value * 2.0 ** ((at - CREDIT_EPOCH).total_seconds() / CREDIT_HALF_LIFE.total_seconds())


def recent_average_credit(growth_sum: float, *, now: datetime) -> float:
    """Verified reward per day, exponentially weighted with a CREDIT_HALF_LIFE half-life.

    growth_sum = sum of reward * 2^((t - epoch)/H); the decayed sum at `now` is growth_sum *
    2^(-(now - epoch)/H); a steady r per day gives a decayed sum of r * H/ln 2 days, hence the factor
    ln 2 / H (in days).
    """
    if growth_sum <= 0:
        return 0.0
    half_life_days = CREDIT_HALF_LIFE.total_seconds() / 86400
    exponent = -(now - CREDIT_EPOCH).total_seconds() / CREDIT_HALF_LIFE.total_seconds()
    return growth_sum * (2.0**exponent) * LN2 / half_life_days
