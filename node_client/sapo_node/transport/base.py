"""The interface between the training loop and the swarm. Every method returns at once: the loop
never waits on the network (only `wait_connected` and `flush`, which take a timeout, block)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sapo_node import protocol
from sapo_node.groups import Group
from sapo_node.tasks import Catalogue

if TYPE_CHECKING:  # torch and safetensors: only a node that trains loads them
    from sapo_node.commitments import CommitmentStore
    from sapo_node.pause import PauseGate


@dataclass(frozen=True)
class Preparing:
    """What a node does before its first round (a `status`'s `preparing`), how far it is and the
    seconds it expects that to take still, each when known."""

    #: One of protocol.PREPARING_STEPS.
    step: str
    #: 0 to 1.
    progress: float | None = None
    eta_seconds: float | None = None

    def to_wire(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"preparing": self.step}
        if self.progress is not None:
            fields["progress"] = round(min(max(self.progress, 0.0), 1.0), 3)
        if self.eta_seconds is not None:
            fields["eta_seconds"] = round(min(max(self.eta_seconds, 0.0), protocol.MAX_ROUND_SECONDS))
        return fields


@dataclass
class Hello:
    """What a node says about itself when it connects (protocol `hello`)."""

    client: str
    model: str
    hardware: str
    local: int
    external: int
    #: The swarm's slug, protocol.ANY_SWARM, or None (the site's default swarm: the field is left out).
    swarm: str | None = None
    #: The node answers held-out checks (protocol.HELDOUT_CHECK): the server asks only those that say so.
    heldout: bool = False

    def to_wire(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"swarm": self.swarm} if self.swarm is not None else {}
        if self.heldout:
            fields["heldout"] = True
        return protocol.frame(
            protocol.HELLO,
            client=self.client,
            model=self.model,
            hardware=self.hardware,
            local=self.local,
            external=self.external,
            **fields,
        )


@dataclass
class TransportCounts:
    """Verdicts on this node's shares so far, and what is still waiting for one."""

    accepted: int = 0
    #: Rejected by the pool (its verdict: the site counts these).
    rejected: int = 0
    pending: int = 0
    #: Refused by the node itself and never sent (text the pool cannot store, a retired swarm's group).
    refused: int = 0


class Transport(ABC):
    def start(self, hello: Hello) -> None:  # noqa: B027 - optional hook
        """Begin talking to the swarm (non-blocking)."""

    @abstractmethod
    def share(self, groups: list[Group]) -> None:
        """Offer own groups to the swarm; durable before it returns where the transport has a disk queue."""

    @abstractmethod
    def take_external(self, max_n: int) -> list[Group]:
        """Up to `max_n` groups from other nodes that have already arrived (possibly none); never blocks."""

    @abstractmethod
    def report(self, report: dict[str, Any]) -> None:
        """Send a round's report (protocol `report` fields, without type/v); best effort."""

    @property
    @abstractmethod
    def status(self) -> str:
        """A short word for the progress line: silo, connecting, connected, retrying, refused, ..."""

    def catalogue(self) -> Catalogue | None:
        """The catalogue the swarm accepts, once known (None: use the default)."""
        return None

    def counts(self) -> TransportCounts:
        return TransportCounts()

    def challenge(self) -> str | None:
        """The newest challenge the server issued this node (None: none yet, or no server): the next
        round's questions come from it (sapo_node.tasks.TaskStream.follow)."""
        return None

    def unsettled_weights(self) -> set[str]:
        """The weights digests of shared groups still waiting for the pool's verdict (their
        commitments are kept: sapo_node.commitments)."""
        return set()

    def answer_audits(self, store: CommitmentStore) -> None:  # noqa: B027 - optional hook
        """Upload from `store` the checkpoints the server asks to audit (a transport with a server)."""

    def attach_gate(self, gate: PauseGate) -> None:  # noqa: B027 - optional hook
        """The node's pause gate: a transport with a server holds it for protocol.PAUSE_SITE while the
        node's owner has paused it from the site, and tells the server its reasons."""

    def tell_state(  # noqa: B027 - optional hook
        self,
        state: str,
        *,
        round_seconds: float | None = None,
        tokens_per_second: float | None = None,
        preparing: Preparing | None = None,
    ) -> None:
        """What the node is doing now (one of protocol.NODE_STATES) and its last round's figures, or
        while it prepares what it prepares, for the site (a `status` frame where the server takes one)."""

    def heldout_check(self) -> protocol.WireHeldoutCheck | None:
        """The held-out check the server asked and the node has not taken yet (taking it clears it); None
        when there is none, or no server."""
        return None

    def answer_heldout(  # noqa: B027 - optional hook
        self, check: protocol.WireHeldoutCheck, *, round: int, texts: list[str]
    ) -> None:
        """Send the node's answers to `check`, one text per question in its order (best effort)."""

    def wait_connected(self, timeout: float) -> bool:
        """Block up to `timeout` seconds for the swarm's welcome; True if it came."""
        return False

    def flush(self, timeout: float) -> bool:
        """Block up to `timeout` seconds until every group shared for the node's swarm has a verdict
        (those of other swarms wait for the node to join them); True if none is pending."""
        return True

    def close(self) -> None:  # noqa: B027 - optional hook
        """Stop background work; undelivered shares stay in the outbox for the next run."""


class SiloTransport(Transport):
    """No swarm: nothing is shared and nothing arrives (--offline, or J = 0 in spirit)."""

    def share(self, groups: list[Group]) -> None:
        pass

    def take_external(self, max_n: int) -> list[Group]:
        return []

    def report(self, report: dict[str, Any]) -> None:
        pass

    @property
    def status(self) -> str:
        return "silo"
