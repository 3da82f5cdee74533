"""A swarm of nodes in one process, stepped round-robin: node 1 round r, node 2 round r, ...

Why one process: a study is 4 configurations x several seeds x N nodes, and the project's machine
has 2 CPU cores. N node processes would each want both cores and spend their time fighting over
them; one process that gives each node the whole machine in turn finishes the same work sooner and
makes the schedule repeatable. It is a *synchronous schedule of asynchronous nodes*: every node is
a full node (its own policy, optimizer, question stream, RNG and its own WebSocket connection to
the real server, with its own outbox and sample buffer), nothing is shared in memory, and the
nodes meet only in the platform's pool. What the schedule fixes is the timing: at the end of its
turn a node waits until the server has acknowledged its shares (so the next nodes can sample them),
and the groups it trains on in round r were sampled from the pool in the background after its
previous turn, i.e. they come from the other nodes' last round(s) -- about the staleness an
asynchronous node has when its peers run at the same speed.

A round is the node client's own: `sapo_node.loop.start_node` builds the node and
`sapo_node.loop.play_round` plays one round of it (sample -> generate -> score -> share ->
assemble -> update -> report and log), exactly what `sapo-node run` does. The study adds four
things around it: a question stream drawing B distinct datasets per round (the paper's "one
question from each of 8 of the 9 specialties"), a torch RNG state per node (so what node k samples
does not depend on the other nodes' draws), no checkpoints (a study never resumes a node), and a
proof with its log-probabilities for each group the node shares (LogprobProofs).
"""

from __future__ import annotations

import contextlib
import copy
import io
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import torch

from sapo_node.audit import model_digest
from sapo_node.config import NodeConfig
from sapo_node.generate import Generated
from sapo_node.groups import Group, make_proof
from sapo_node.loop import Node, play_round, start_node
from sapo_node.tasks import MAX_INDEX, Catalogue, TaskRef, TaskStream
from sapo_node.transport import Transport

#: A proof's challenge when the socket has none yet (the pool needs a non-empty one and stores the
#: group unaudited either way).
UNCHALLENGED = "unchallenged"


class StratifiedTaskStream(TaskStream):
    """A node's question stream drawing B *distinct* datasets per round (the paper: one question
    from each of 8 of the 9 specialties), cycling through a fresh shuffle when B exceeds the
    catalogue. Deterministic in the node's seed, like TaskStream. `last_draw` is the latest round's
    questions (the loop draws once per round)."""

    last_draw: list[TaskRef] = []

    def __init__(self, catalogue: Catalogue, seed: int, datasets: Collection[str] = ()) -> None:
        super().__init__(catalogue, seed)
        #: The datasets drawn (StudyConfig.datasets; empty: the whole catalogue). Kept apart from the
        #: catalogue, which the loop sets to the swarm's whole one and which re-scores external groups.
        self.datasets = frozenset(datasets)

    def draw(self, n: int) -> list[TaskRef]:
        tasks = [spec for spec in self.catalogue.tasks if not self.datasets or spec.dataset in self.datasets]
        picked: list[Any] = []
        while len(picked) < n:
            shuffled = self._rng.sample(tasks, len(tasks))
            picked.extend(shuffled[: n - len(picked)])
        self.last_draw = [TaskRef(spec.dataset, self.seed, self._rng.randrange(MAX_INDEX)) for spec in picked]
        return list(self.last_draw)


def question_key(ref: TaskRef) -> str:
    return f"{ref.dataset}/{ref.seed}/{ref.index}"


@dataclass
class SwarmNode:
    """One node of a study: the node client's Node, its question stream and its own RNG state."""

    index: int
    node: Node
    stream: StratifiedTaskStream
    rng_state: dict[str, Any]

    @classmethod
    def start(
        cls,
        index: int,
        config: NodeConfig,
        transport: Transport,
        policy: tuple[Any, Any],
        datasets: Collection[str] = (),
    ) -> SwarmNode:
        """Build the node, say hello and wait (config.connect_wait) for the server's catalogue; it draws
        from `datasets` of it (empty: all) and shares its groups with their log-probabilities."""
        with contextlib.redirect_stdout(io.StringIO()):  # start_node prints its config; config.json keeps it
            node = start_node(config, transport, policy=policy)
        catalogue = transport.catalogue()
        if catalogue is None:
            detail = getattr(transport, "last_error", None)
            raise RuntimeError(f"node {index} got no welcome from the server ({transport.status}; {detail})")
        stream = StratifiedTaskStream(catalogue, node.config.seed, datasets)
        node.state.stream = stream
        node.prove_unchallenged = LogprobProofs(node)
        with torch.random.fork_rng(devices=_cuda_devices(node.model)):
            torch.manual_seed(node.config.seed)
            rng_state = _get_rng(node.model)
        return cls(index, node, stream, rng_state)

    @property
    def config(self) -> NodeConfig:
        return self.node.config

    @property
    def transport(self) -> Transport:
        return self.node.transport

    def step(self) -> dict[str, Any]:
        """The node's next round; returns the loop's metrics row plus the round's question identities."""
        with torch.random.fork_rng(devices=_cuda_devices(self.node.model)):
            _set_rng(self.node.model, self.rng_state)
            row = play_round(self.node)
            self.rng_state = _get_rng(self.node.model)
        assert row is not None  # only a stop request makes play_round return None
        row["questions"] = ";".join(question_key(ref) for ref in self.stream.last_draw)
        row["completions"] = self.config.questions * self.config.generations
        return row

    def close(self, flush_wait: float) -> bool:
        """Wait for the last verdicts, then hang up; True if nothing was left pending."""
        flushed = self.transport.flush(flush_wait)
        self.transport.close()
        return flushed


class LogprobProofs:
    """Gives a node's groups made without a server challenge a proof: each completion's sampled token ids
    and log-probabilities, the digest of the weights that generated them, and the challenge its socket
    holds (loop.Node.prove_unchallenged).

    The study's nodes draw their own paired question streams (the same questions in every configuration
    of a seed), never the challenge's, so without this their groups would carry no log-probabilities and
    `--correction` and `--offpolicy-filter` would change nothing. The pool stores such a group unaudited
    (its question is not the challenge's: pool.challenges) and serves it with its proof like any other, so
    a receiving node reads the sharer's log-probabilities (groups.sharer_logprobs) as it would a live
    node's. Every configuration's nodes do this, the silo's too, so the arms differ only in what they take.
    """

    def __init__(self, node: Node) -> None:
        self.node = node

    def __call__(self, own: list[tuple[Group, Generated]]) -> None:
        missing = [(group, generated) for group, generated in own if group.proof is None]
        if not missing:
            return
        config = self.node.config
        challenge = self.node.transport.challenge() or UNCHALLENGED
        weights = model_digest(self.node.model)  # before the update: the weights that generated them
        for group, generated in missing:
            group.proof = make_proof(
                challenge=challenge,
                weights=weights,
                model=config.model,
                temperature=config.temperature,
                completion_ids=generated.completion_ids,
                logprobs=generated.logprobs,
            )


def clone_policy(policy: tuple[Any, Any]) -> tuple[Any, Any]:
    """A node's own copy of the initial model (every node of every run starts from the same weights);
    the tokenizer is only read, so it is shared."""
    model, tokenizer = policy
    return copy.deepcopy(model), tokenizer


def _cuda_devices(model: Any) -> list[int]:
    device = next(model.parameters()).device
    return [device.index or 0] if device.type == "cuda" else []


def _get_rng(model: Any) -> dict[str, Any]:
    state = {"cpu": torch.get_rng_state()}
    devices = _cuda_devices(model)
    if devices:
        state["cuda"] = torch.cuda.get_rng_state(devices[0])
    return state


def _set_rng(model: Any, state: dict[str, Any]) -> None:
    torch.set_rng_state(state["cpu"])
    devices = _cuda_devices(model)
    if devices and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], devices[0])
