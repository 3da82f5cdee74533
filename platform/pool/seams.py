"""What the pool asks of a moderation layer, and the one it uses now.

The pool is below moderation (docs/architecture.md): it never imports it. It defines here what it
needs at its three points of contact, as a typed Protocol, with a default that moderates nothing.
The moderation app registers its implementation in its AppConfig.ready(); a deployment without it
runs the pool unmoderated (every accepted group with variance sampleable, uniform sampling, the
plain message rate).

- `rollouts_screen` / `rollouts_record_part` / `rollouts_recorded`: pool.services.rollout_share_batch,
  around its INSERT, for a batch of shares of different nodes. Screening runs before the INSERT and
  decides which groups are held: the INSERT writes them "held" and not sampleable in the same
  statement, so no sample can ever see them. What moderation records of the batch (audit, flags,
  fingerprints, trust) is a `RecordPart`: data-modifying CTEs the pool runs inside its INSERT
  statement, one statement and so one transaction for everything (three round trips and a
  transaction's BEGIN and COMMIT fewer than a statement of its own: docs/benchmarks.md, "How
  ingest is made fast"). `rollouts_recorded` follows the statement, with the ids really inserted (work that
  need not be atomic with the INSERT, such as an outlier scan now and then).
- `sample_keep` / `weighted_pick`: pool.selectors.rollout_sample_json, on its uniform draws; both return
  None when weighting is off, and the pool then draws uniformly.
- `node_message_quotas`: pool.opening, when sockets open (those opening together in one call).
"""

from __future__ import annotations

import random
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


@dataclass(frozen=True)
class RecordPart:
    """What moderation writes about a batch, as part of the pool's INSERT statement.

    `ctes`: one or more common table expressions, `name AS (...)` separated by commas, that the pool
    appends to its own (its `WITH` list); they may read the pool's CTE `inserted` (id, node_id, verdict:
    the groups this statement really inserted, an id already stored being left out) and the parameter
    `now` (the statement's time), and must write nothing about a group that is not in `inserted`. The
    text must be the same for every batch (the statement is prepared once per connection), its
    parameters named apart from the pool's (a prefix of their own). `params`: their values."""

    ctes: str
    params: Mapping[str, object]


class Screened(Protocol):
    """What screening decided for one share, as the pool reads it."""

    @property
    def held(self) -> set[uuid.UUID]:
        """Ids to store held (moderation status "held", never sampleable)."""
        ...


class PoolModeration(Protocol):
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
    """Set the pool's moderation (moderation's AppConfig.ready(); NO_MODERATION to switch it off)."""
    global _current
    _current = implementation


def moderation() -> PoolModeration:
    """The moderation in force: the registered one, else NO_MODERATION."""
    return _current
