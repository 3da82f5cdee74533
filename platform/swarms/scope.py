"""Which part of the site a figure, a rule list or a presence count covers: the whole site (every
swarm) or one swarm, named. A missing swarm id means nothing here: the pool always works in one swarm
and takes its id (the socket's place decides which), while figures, presence, community and
moderation take a Scope, so a default-swarm caller's id can never be read as "every swarm"."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

from django.db.models import QuerySet

_Rows = TypeVar("_Rows", bound=QuerySet[Any])


@dataclass(frozen=True, slots=True)
class Scope:
    """The whole site (`Scope.site()`) or one swarm (`Scope.swarm(id)`); build it with those two."""

    #: The swarm's id; 0 for the whole site (swarm ids start at 1).
    _swarm: int

    def __post_init__(self) -> None:
        if isinstance(self._swarm, bool) or not isinstance(self._swarm, int) or self._swarm < 0:
            raise TypeError(f"a scope is Scope.site() or Scope.swarm(<swarm id>), not {self._swarm!r}")

    @classmethod
    def site(cls) -> Scope:
        return SITE

    @classmethod
    def swarm(cls, swarm_id: int) -> Scope:
        if isinstance(swarm_id, bool) or not isinstance(swarm_id, int) or swarm_id <= 0:
            raise TypeError(f"Scope.swarm takes a swarm's id, not {swarm_id!r}")
        return cls(swarm_id)

    @staticmethod
    def check(scope: object) -> Scope:
        """`scope` itself when it is a Scope; TypeError otherwise (a bare id or None is refused)."""
        if not isinstance(scope, Scope):
            raise TypeError(f"expected a Scope (Scope.site() or Scope.swarm(id)), not {scope!r}")
        return scope

    @property
    def is_site(self) -> bool:
        return self._swarm == 0

    @property
    def swarm_id(self) -> int:
        """The one swarm's id; ValueError for the whole site (ask `is_site` first)."""
        if self._swarm == 0:
            raise ValueError("the whole site's scope has no swarm id")
        return self._swarm

    def holds(self, swarm_id: int) -> bool:
        """Whether a row of swarm `swarm_id` counts in this scope."""
        return self._swarm in (0, swarm_id)

    def rows(self, queryset: _Rows, field: str = "swarm_id") -> _Rows:
        """`queryset` narrowed to this scope (unchanged for the whole site) on its swarm column `field`."""
        return queryset if self._swarm == 0 else queryset.filter(**{field: self._swarm})

    def key(self) -> str:
        """A short text for cache keys: "site" or the swarm's id."""
        return "site" if self._swarm == 0 else str(self._swarm)

    def __repr__(self) -> str:
        return "Scope.site()" if self._swarm == 0 else f"Scope.swarm({self._swarm})"


SITE = Scope(0)
