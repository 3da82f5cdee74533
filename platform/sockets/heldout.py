"""Held-out checks (docs/protocol.md, "heldout_check"): what the site's held-out accuracy is made of.

Now and then (after every SAPO_HELDOUT_EVERY_ROUNDS rounds a node reports, at most once every
SAPO_HELDOUT_MIN_SECONDS) the server asks a node socket whose hello said `heldout` a few questions of its
swarm's held-out stream: dataset seed protocol.HELDOUT_SEED, which a node's own stream never takes
(sapo_node.tasks.TaskStream) and the pool refuses in a share (pool.verification), at random indices, datasets drawn by the catalogue's weights. The node answers greedily with its current policy between two rounds (sapo_node.heldout_check);
the answers are scored by the verifiers a share is verified with and one row per check is stored
(pool.models.HeldoutScore). The figures read those rows (figures.swarm, figures.heldout).

What a socket asked is held by the socket (`SocketHeldout`), in memory: answers on another socket, for a
check it did not ask, after the deadline, or a second time are refused with a typed error
(protocol.HELDOUT_UNASKED, HELDOUT_LATE, HELDOUT_DUPLICATE) and nothing is stored. A check a lost socket
took with it is simply not scored.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import msgspec
from django.conf import settings

from common.errors import ApplicationError
from common.native import native
from pool.builds import build_cost, is_cheap
from pool.models import HeldoutScore
from sapo_node import protocol
from sapo_node.tasks import Catalogue, ScoringTimeout, TaskSpec, build_first, random_indices, score_completions
from sockets.messages import HeldoutAnswers

#: Checks a socket remembers after asking (the newest): enough to tell a late or repeated answer from one
#: to a check never asked.
REMEMBERED_CHECKS = 8
#: Which questions a check asks: the operating system's randomness, so no node can foresee them, and one
#: for the process, since a generator per socket would hold its 2.5 KiB state on every open socket.
CHECK_RNG = random.SystemRandom()


@dataclass
class AskedCheck:
    """One check as the server asked it: each question's task and entry (kept to score the answers)."""

    id: uuid.UUID
    questions: list[tuple[TaskSpec, dict[str, Any]]]
    asked_at: datetime
    deadline: float
    answered: bool = False

    def wire(self, max_new_tokens: int) -> dict[str, Any]:
        """The `heldout_check` frame's fields."""
        check = protocol.WireHeldoutCheck(
            check=self.id,
            questions=[
                protocol.WireHeldoutQuestion(id=i, dataset=spec.dataset, question=entry["question"])
                for i, (spec, entry) in enumerate(self.questions)
            ],
            max_new_tokens=max_new_tokens,
            deadline=round(self.deadline, 3),
        )
        return {"type": protocol.HELDOUT_CHECK, **msgspec.to_builtins(check)}


def heldout_check_make(*, catalogue: Catalogue, questions: int, now: float, rng: random.Random) -> AskedCheck | None:
    """A check of `questions` questions of the held-out stream of `catalogue` (CPU: run off the event
    loop, building entries costs reasoning-gym's time), drawn from its datasets that are cheap to build
    (pool.builds): a check is the server's own doing, charged to no share, so it never builds a costly
    dataset. None when the catalogue has no cheap dataset."""
    weights = list(catalogue.weights) or [1.0] * len(catalogue.tasks)
    cheap = [(spec, w) for spec, w in zip(catalogue.tasks, weights, strict=True) if is_cheap(build_cost(spec))]
    if not cheap:
        return None
    specs = rng.choices([spec for spec, _ in cheap], weights=[w for _, w in cheap], k=questions)
    asked = [(spec, build_first(spec, protocol.HELDOUT_SEED, random_indices(rng))[1]) for spec in specs]
    return AskedCheck(
        id=uuid.uuid4(),
        questions=asked,
        asked_at=datetime.fromtimestamp(now, UTC),
        deadline=now + settings.SAPO_HELDOUT_DEADLINE_SECONDS,
    )


@dataclass
class SocketHeldout:
    """One node socket's held-out checks: whether its node takes them, when the next is due, and the
    checks it asked (the newest REMEMBERED_CHECKS). Used on the socket's event loop only."""

    supported: bool = False
    last_round: int | None = None
    last_at: float = float("-inf")
    asked: dict[uuid.UUID, AskedCheck] = field(default_factory=dict)

    def due(self, round_: int, now: float) -> bool:
        """Whether a report of `round_` at `now` earns a check: the node takes them, checks are on, every
        SAPO_HELDOUT_EVERY_ROUNDS rounds (the first report counts) and SAPO_HELDOUT_MIN_SECONDS apart,
        and none is still open."""
        every = settings.SAPO_HELDOUT_EVERY_ROUNDS
        if not self.supported or every <= 0 or now - self.last_at < settings.SAPO_HELDOUT_MIN_SECONDS:
            return False
        if any(not c.answered and now < c.deadline for c in self.asked.values()):
            return False
        return self.last_round is None or round_ - self.last_round >= every or round_ < self.last_round

    def record(self, check: AskedCheck, round_: int, now: float) -> None:
        self.last_round, self.last_at = round_, now
        self.asked[check.id] = check
        while len(self.asked) > REMEMBERED_CHECKS:
            del self.asked[next(iter(self.asked))]

    def take(self, message: HeldoutAnswers, now: float) -> tuple[AskedCheck, list[str]]:
        """The check `message` answers and the answer texts in its questions' order, or ApplicationError
        with the protocol's code: not asked here (or a question it does not have), past its deadline,
        answered already or a question answered twice, not every question answered."""
        check = self.asked.get(message.check)
        if check is None:
            raise ApplicationError(protocol.HELDOUT_UNASKED, f"no held-out check {message.check} was asked here")
        if check.answered:
            raise ApplicationError(protocol.HELDOUT_DUPLICATE, f"held-out check {message.check} is answered already")
        if now >= check.deadline:
            raise ApplicationError(protocol.HELDOUT_LATE, f"held-out check {message.check} was due before now")
        texts: dict[int, str] = {}
        for question, text in message.answers:
            if question >= len(check.questions):
                raise ApplicationError(
                    protocol.HELDOUT_UNASKED, f"held-out check {message.check} has no question {question}"
                )
            if question in texts:
                raise ApplicationError(protocol.HELDOUT_DUPLICATE, f"question {question} is answered twice")
            texts[question] = text
        if len(texts) != len(check.questions):
            raise ApplicationError(
                protocol.INVALID_MESSAGE, f"answers: {len(check.questions)} questions asked, {len(texts)} answered"
            )
        return check, [texts[i] for i in range(len(check.questions))]


def heldout_score_record(
    *, node_id: int, swarm_id: int, check: AskedCheck, texts: list[str], round_: int
) -> HeldoutScore:
    """Score `texts` (one per question of `check`) with the verifiers a share's completions are scored
    with (as pool.verification: the answers taken in C when sapo_native is built) and store the check's
    row. An answer whose sandboxed scorer runs out of time scores 0."""
    fast = native()
    extract = fast.answers if fast is not None else None
    rewards = []
    for (spec, entry), text in zip(check.questions, texts, strict=True):
        try:
            rewards += score_completions(spec, protocol.HELDOUT_SEED, entry, [text], extract)
        except ScoringTimeout:
            rewards.append(0.0)
    return HeldoutScore.objects.create(
        node_id=node_id,
        swarm_id=swarm_id,
        round=round_,
        questions=len(rewards),
        score=min(float(len(rewards)), max(0.0, sum(rewards))),
        asked_at=check.asked_at,
    )
