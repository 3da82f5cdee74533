"""What the pool asks of a moderation layer, and the one it uses now.

The pool is below moderation (docs/architecture.md): it never imports it. It defines here what it
needs at its three points of contact, as a typed Protocol, with a default that moderates nothing.
The moderation app registers its implementation in its AppConfig.ready(); a deployment without it
runs the pool unmoderated (every accepted group with variance sampleable, uniform sampling, the
plain message rate).

- `rollouts_screen` / `rollouts_record`: pool.services.rollout_share_batch, around its INSERT, for
  a batch of shares of different nodes. Screening runs before the INSERT and decides which groups
  are held: the INSERT writes them "held" and not sampleable in the same statement, so no sample can
  ever see them. `rollouts_record` runs right after the INSERT, in its transaction (audit, flags,
  trust).
- `sample_keep` / `weighted_pick`: pool.selectors.rollout_sample, on its uniform draws; both return
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

    def rollouts_record(self, *, screenings: Sequence[Screened], inserted: set[uuid.UUID]) -> None: ...

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

    def rollouts_record(self, *, screenings: Sequence[Screened], inserted: set[uuid.UUID]) -> None:
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
