"""An in-memory pool shared by several nodes in one process (tests and local experiments).

It behaves like the platform's pool in what matters to a node: ids are idempotent, a node never
samples its own groups, sampling is uniform, and by default only groups whose rewards differ are
sampleable. It does not re-verify (the receiving node does that anyway), and audits nothing: its
`challenge`, if set, is the one every node draws its questions from (None: they draw their own).
"""

from __future__ import annotations

import copy
import random
import threading
from typing import Any

from sapo_node.groups import Group
from sapo_node.tasks import Catalogue
from sapo_node.transport.base import Hello, Transport, TransportCounts


class MemoryPool:
    def __init__(
        self,
        catalogue: Catalogue | None = None,
        *,
        only_informative: bool = True,
        seed: int = 0,
        challenge: str | None = None,
    ) -> None:
        self.catalogue = catalogue
        self.challenge = challenge
        self.only_informative = only_informative
        self.groups: dict[str, tuple[str, Group]] = {}  # id -> (author node, group)
        self.reports: list[tuple[str, dict[str, Any]]] = []
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def add(self, node: str, groups: list[Group]) -> list[str]:
        """Store groups by id (a known id is left unchanged); returns the ids accepted."""
        with self._lock:
            for group in groups:
                self.groups.setdefault(group.id, (node, copy.deepcopy(group)))
            return [g.id for g in groups]

    def sample(self, node: str, n: int) -> list[Group]:
        with self._lock:
            candidates = [
                (author, g)
                for author, g in self.groups.values()
                if author != node and (not self.only_informative or max(g.rewards) - min(g.rewards) > 1e-6)
            ]
            picked = self._rng.sample(candidates, min(n, len(candidates)))
        out = []
        for author, group in picked:
            group = copy.deepcopy(group)
            group.node = author
            out.append(group)
        return out


class MemoryTransport(Transport):
    def __init__(self, pool: MemoryPool, node: str) -> None:
        self.pool = pool
        self.node = node
        self.hello: Hello | None = None
        self._accepted = 0

    def start(self, hello: Hello) -> None:
        self.hello = hello

    def share(self, groups: list[Group]) -> None:
        self._accepted += len(self.pool.add(self.node, groups))

    def take_external(self, max_n: int) -> list[Group]:
        return self.pool.sample(self.node, max_n) if max_n > 0 else []

    def report(self, report: dict[str, Any]) -> None:
        with self.pool._lock:
            self.pool.reports.append((self.node, dict(report)))

    @property
    def status(self) -> str:
        return "memory"

    def catalogue(self) -> Catalogue | None:
        return self.pool.catalogue

    def counts(self) -> TransportCounts:
        return TransportCounts(accepted=self._accepted)

    def challenge(self) -> str | None:
        return self.pool.challenge

    def wait_connected(self, timeout: float) -> bool:
        return True
