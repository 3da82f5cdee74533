"""What the pool asks of a moderation layer, and the one it uses now.

The pool is below moderation (docs/architecture.md): it never imports it. It defines here what it
needs at its three points of contact, as a typed Protocol, with a default that moderates nothing.
The moderation app registers its implementation in its AppConfig.ready(); a deployment without it
runs the pool unmoderated (every accepted group with variance sampleable, uniform sampling, the
plain message rate).

- `rollouts_screen` / `rollouts_record_part` / `rollouts_recorded`: pool.ingest.rollout_share_batch,
  around its INSERT, for a batch of shares of different nodes. Screening runs before the INSERT and
  decides which groups are held: the INSERT writes them "held" and not sampleable in the same
  statement, so no sample can ever see them. What moderation records of the batch (audit, flags,
  fingerprints, trust) is a `RecordPart`: data-modifying CTEs the pool runs inside its INSERT
  statement (declared once as a `RecordSql`, whose names are checked against the statement's when
  moderation registers), one statement and so one transaction for everything (three round trips and a
  transaction's BEGIN and COMMIT fewer than a statement of its own: docs/benchmarks.md, "How
  ingest is made fast"). `rollouts_recorded` follows the statement, with the ids really inserted (work that
  need not be atomic with the INSERT, such as an outlier scan now and then).
- `sample_keep` / `weighted_pick`: pool.selectors.rollout_sample_json, on its uniform draws; both return
  None when weighting is off, and the pool then draws uniformly.
- `node_message_quotas`: pool.opening, when sockets open (those opening together in one call).
"""

from __future__ import annotations

import random
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from pool.messages import RolloutIn
from pool.verification import Verification


@dataclass(frozen=True)
class ShareToScreen:
    """One node's freshly verified share, as screening takes it."""

    node_id: int
    rollouts: Sequence[RolloutIn]
    checks: Mapping[uuid.UUID, Verification]


#: The names of the pool's INSERT statement (pool.ingest_statement._INSERT_SQL, which asserts it uses exactly
#: these): its common table expressions and its parameters. A RecordSql may read the CTE `inserted`
#: (id, node_id, verdict: the groups this statement really inserted, an id already stored left out)
#: and the parameter `now` (the statement's time); it may name nothing else of these.
INSERT_CTE_NAMES = frozenset({"inserted", "counts", "conflicts", "verdict_counts", "storage", "totals"})
INSERT_PARAM_NAMES = frozenset(
    {
        "now",
        "hour",
        "nodes",
        "owners",
        "sent",
        "total_bytes",
        "id",
        "node",
        "round",
        "dataset",
        "seed",
        "index",
        "question",
        "answer",
        "completions",
        "count",
        "claimed",
        "verified",
        "bytes",
        "verdict",
        "reason",
        "has_variance",
        "sampleable",
        "held",
        "swarm",
        "catalogue_version",
        "sequence",
    }
)
#: What of the statement a RecordSql's CTEs may read.
RECORD_READS_CTES = frozenset({"inserted"})
RECORD_READS_PARAMS = frozenset({"now"})

#: `name AS (` or `name AS MATERIALIZED (` opening a CTE (first, after WITH, or after the previous
#: one's closing parenthesis and comma); a parameter.
_CTE_NAME = re.compile(r"(?:\A|\),|\bWITH)\s*(\w+) AS (?:(?:NOT )?MATERIALIZED )?\(")
_PARAM_NAME = re.compile(r"%\((\w+)\)[sb]")


class RecordContractError(ValueError):
    """A RecordSql whose text and declaration disagree, or that names what the pool's statement uses."""


def sql_names(sql: str) -> tuple[set[str], set[str]]:
    """(the CTE names, the parameter names) a statement or list of CTEs uses."""
    return set(_CTE_NAME.findall(sql)), set(_PARAM_NAME.findall(sql))


@dataclass(frozen=True)
class RecordSql:
    """What moderation writes about a batch, declared once: `ctes`, one or more common table
    expressions (`name AS (...)`, comma-separated) that the pool appends to its INSERT statement's
    `WITH` list, with the names of those CTEs (`cte_names`) and of the parameters they take
    (`param_names`). They may read the pool's CTE `inserted` and parameter `now` (RECORD_READS_*) and
    must write nothing about a group that is not in `inserted`. The text is the same for every batch
    (the statement is prepared once per connection).

    Checked when made: the text names exactly the declared CTEs and parameters (besides what it may
    read of the pool's). Checked when registered (`moderation_register`) and when the pool first builds
    its statement with it (`record_sql_check`): no declared name is one the pool's statement uses, so
    a collision fails at start-up, not as a wrong row."""

    ctes: str
    cte_names: frozenset[str]
    param_names: frozenset[str]

    def __post_init__(self) -> None:
        ctes, params = sql_names(self.ctes)
        if ctes != self.cte_names:
            raise RecordContractError(
                f"the record's text names the CTEs {sorted(ctes)}, declared {sorted(self.cte_names)}"
            )
        if params - RECORD_READS_PARAMS != self.param_names:
            raise RecordContractError(
                f"the record's text takes the parameters {sorted(params - RECORD_READS_PARAMS)}, "
                f"declared {sorted(self.param_names)}"
            )

    def part(self, params: Mapping[str, object]) -> RecordPart:
        """This SQL with a batch's values: exactly the declared parameters (a missing one would fail in
        PostgreSQL, an extra one would shadow nothing but is a mistake)."""
        if params.keys() != self.param_names:
            got = set(params)
            raise RecordContractError(
                f"record parameters: missing {sorted(self.param_names - got)}, undeclared {sorted(got - self.param_names)}"
            )
        return RecordPart(sql=self, params=params)


@dataclass(frozen=True)
class RecordPart:
    """A RecordSql with one batch's parameter values (made by `RecordSql.part`)."""

    sql: RecordSql
    params: Mapping[str, object]


def record_sql_check(sql: RecordSql) -> None:
    """Raise RecordContractError when `sql` names a CTE or a parameter of the pool's INSERT statement."""
    clash_ctes = sql.cte_names & INSERT_CTE_NAMES
    clash_params = sql.param_names & INSERT_PARAM_NAMES
    if clash_ctes or clash_params:
        raise RecordContractError(
            f"the record names what the pool's INSERT uses: CTEs {sorted(clash_ctes)}, parameters {sorted(clash_params)}"
        )


class Screened(Protocol):
    """What screening decided for one share, as the pool reads it."""

    @property
    def held(self) -> set[uuid.UUID]:
        """Ids to store held (moderation status "held", never sampleable)."""
        ...


class PoolModeration(Protocol):
    #: The SQL `rollouts_record_part` fills in (None: it records nothing).
    record_sql: RecordSql | None

    def rollouts_screen(self, *, shares: Sequence[ShareToScreen]) -> Sequence[Screened]:
        """A Screened per share, in order; the shares are of different nodes."""
        ...

    def rollouts_record_part(self, *, screenings: Sequence[Screened]) -> RecordPart | None:
        """What to write about the batch inside the INSERT's statement; None: nothing."""
        ...

    def rollouts_recorded(self, *, screenings: Sequence[Screened], inserted: set[uuid.UUID]) -> None:
        """After the statement: `inserted` are the ids it really inserted."""
        ...

    def sample_keep(self, *, node_ids: Sequence[int], rng: random.Random) -> list[bool] | None: ...

    def weighted_pick(
        self, *, candidates: Sequence[tuple[uuid.UUID, int]], n: int, rng: random.Random
    ) -> list[uuid.UUID] | None: ...

    def node_message_quotas(self, *, node_ids: Sequence[int], base: int) -> dict[int, int]: ...


class _NothingHeld:
    held: set[uuid.UUID] = frozenset()  # type: ignore[assignment]


_NOTHING_HELD = _NothingHeld()


class NoModeration:
    """The default: holds nothing, weights nothing, leaves the message rate as configured."""

    record_sql = None

    def rollouts_screen(self, *, shares: Sequence[ShareToScreen]) -> Sequence[Screened]:
        return [_NOTHING_HELD] * len(shares)

    def rollouts_record_part(self, *, screenings: Sequence[Screened]) -> RecordPart | None:
        return None

    def rollouts_recorded(self, *, screenings: Sequence[Screened], inserted: set[uuid.UUID]) -> None:
        return None

    def sample_keep(self, *, node_ids: Sequence[int], rng: random.Random) -> list[bool] | None:
        return None

    def weighted_pick(
        self, *, candidates: Sequence[tuple[uuid.UUID, int]], n: int, rng: random.Random
    ) -> list[uuid.UUID] | None:
        return None

    def node_message_quotas(self, *, node_ids: Sequence[int], base: int) -> dict[int, int]:
        return dict.fromkeys(node_ids, base)


NO_MODERATION: PoolModeration = NoModeration()
_current: PoolModeration = NO_MODERATION


def moderation_register(implementation: PoolModeration) -> None:
    """Set the pool's moderation (moderation's AppConfig.ready(); NO_MODERATION to switch it off).
    Raises RecordContractError when its record SQL names what the pool's statement uses."""
    global _current
    if implementation.record_sql is not None:
        record_sql_check(implementation.record_sql)
    _current = implementation


def moderation() -> PoolModeration:
    """The moderation in force: the registered one, else NO_MODERATION."""
    return _current
