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
  statement (declared once as a `RecordSql` of composed CTEs, whose declared names are checked
  against the statement's when moderation registers), one statement and so one transaction for
  everything (three round trips and a transaction's BEGIN and COMMIT fewer than a statement of its
  own: docs/benchmarks.md, "How ingest is made fast"). `rollouts_recorded` follows the statement,
  with the ids really inserted (work that need not be atomic with the INSERT, such as an outlier scan
  now and then).
- `sample_keep` / `weighted_pick`: pool.sampling.rollout_sample, on its uniform draws; both return
  None when weighting is off, and the pool then draws uniformly.
- `node_message_quotas`: sockets.opening, when sockets open (those opening together in one call).
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from psycopg import sql

from common.composed import placeholder_names
from pool.records import RolloutIn
from pool.verification import Verification


@dataclass(frozen=True)
class ShareToScreen:
    """One node's freshly verified share, as screening takes it."""

    node_id: int
    rollouts: Sequence[RolloutIn]
    checks: Mapping[uuid.UUID, Verification]
    #: The swarm the share is stored in (a swarm's own rules apply to it besides the site's).
    swarm_id: int


#: The names of the pool's INSERT statement (pool.ingest_statement, which asserts its composed statement
#: uses exactly these): its common table expressions and its parameters. A RecordSql may read the CTE `inserted`
#: (id, node_id, verdict: the groups this statement really inserted, an id already stored left out)
#: and the parameter `now` (the statement's time); it may name nothing else of these.
INSERT_CTE_NAMES = frozenset({"inserted", "texts", "counts", "conflicts", "verdict_counts", "storage", "totals"})
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
        "proof",
        "proof_weights",
        "proof_audit",
        "proof_audit_reason",
    }
)
#: What of the statement a RecordSql's CTEs may read.
RECORD_READS_CTES = frozenset({"inserted"})
RECORD_READS_PARAMS = frozenset({"now"})


class RecordContractError(ValueError):
    """A RecordSql whose parts and declaration disagree, or that names what the pool's statement uses."""


@dataclass(frozen=True, eq=False)
class RecordSql:
    """What moderation writes about a batch, declared once: `ctes`, common table expressions by name,
    each the composed statement inside its `name AS (...)` (psycopg's `sql` module), which the pool
    appends to its INSERT statement's `WITH` list in this order, and the names of the parameters they
    take (`param_names`, as `sql.Placeholder`s). They may read the pool's CTE `inserted` and
    parameter `now` (RECORD_READS_*) and must write nothing about a group that is not in `inserted`.
    The statement is the same for every batch (prepared once per connection); a RecordSql is
    compared by identity, the pool keeping its rendered statement per RecordSql.

    Checked when made: the placeholders in the CTEs' structure are exactly the declared parameters
    (besides what they may read of the pool's). Checked when registered (`moderation_register`) and
    when the pool first builds its statement with it (`record_sql_check`): no CTE or parameter name is
    one the pool's statement uses, so a collision fails at start-up, not as a wrong row."""

    ctes: Mapping[str, sql.Composable]
    param_names: frozenset[str]

    def __post_init__(self) -> None:
        if not self.ctes:
            raise RecordContractError("a record with no CTEs: register none instead")
        params: set[str] = set()
        for name, body in self.ctes.items():
            if not isinstance(body, sql.Composable):
                raise RecordContractError(f"the CTE {name!r} is {type(body).__name__}, not a composed statement")
            try:
                params |= placeholder_names(body)
            except ValueError as exc:
                raise RecordContractError(f"the CTE {name!r}: {exc}") from None
        if params - RECORD_READS_PARAMS != self.param_names:
            raise RecordContractError(
                f"the record's CTEs take the parameters {sorted(params - RECORD_READS_PARAMS)}, "
                f"declared {sorted(self.param_names)}"
            )

    @property
    def cte_names(self) -> frozenset[str]:
        return frozenset(self.ctes)

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


def record_sql_check(record: RecordSql) -> None:
    """Raise RecordContractError when `record` declares a CTE or a parameter of the pool's INSERT
    statement (its declared names: the CTEs' keys and `param_names`, which its parts were checked
    against when it was made)."""
    clash_ctes = record.cte_names & INSERT_CTE_NAMES
    clash_params = record.param_names & INSERT_PARAM_NAMES
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
