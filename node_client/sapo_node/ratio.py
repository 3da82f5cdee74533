"""How many of a round's training groups come from the swarm (J) and how many are the node's own (I).

`fixed` is the paper's: I and J as configured. `adaptive` is a node-side policy (the paper names
"how to balance local vs external adaptively" as open): it keeps the training set at T = I + J
groups (the configured I and J) and picks J in [0, configured J] each round from two things the node measures itself:

- **own signal**: how many of this round's own groups are informative (rewards not all equal).
  Every own slot an uninformative group leaves empty is given to an external group, so the update
  always sees about T informative groups (a silo node trains on fewer, and that was the whole
  effect of sharing measured in cpu-learn: it acts as a larger batch).
- **peers' quality**: the moving average of the receiving node's own re-scored reward of the
  external completions it received, against the moving average of its own reward on its own
  informative groups (the pool serves only informative groups: like is compared with like). Peers that do
  better than the node have something to teach: one more external slot. Peers that do worse (by
  more than `margin`) lose one, down to none: their groups are mostly failures to push down.

The decision for round r uses round r's own groups (scored before the training set is built) and
the averages up to round r-1; nothing leaves the node.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sapo_node.groups import Group
from sapo_node.tasks import REWARD_TOLERANCE

RATIOS = ("fixed", "adaptive")


def informative(group: Group) -> bool:
    return max(group.rewards) - min(group.rewards) > REWARD_TOLERANCE


@dataclass
class AdaptiveRatio:
    """Picks (I, J) with I + J = `total` and J in [0, `max_external`] each round (see the module docstring)."""

    total: int
    max_external: int
    #: Weight of the newest round in the moving averages.
    decay: float = 0.2
    #: Peers count as worse only when their reward average is this far below the node's.
    margin: float = 0.05
    own_reward: float | None = None
    external_reward: float | None = None

    def choose(self, own: Sequence[Group]) -> tuple[int, int]:
        empty = self.total - min(self.total, sum(informative(g) for g in own))
        external = empty + self.peer_bonus()
        external = max(0, min(self.max_external, self.total, external))
        return self.total - external, external

    def peer_bonus(self) -> int:
        if self.own_reward is None or self.external_reward is None:
            return 0
        if self.external_reward > self.own_reward:
            return 1
        if self.external_reward < self.own_reward - self.margin:
            return -1
        return 0

    def observe(self, own: Sequence[Group], external_rewards: Sequence[float]) -> None:
        """After the round: own groups, and this node's re-scored rewards of every external completion received."""
        # Only informative own groups: the pool serves only groups with a success and a failure, so
        # comparing with all own groups (all-failed ones included) would always favour the peers.
        own_rewards = [r for g in own if informative(g) for r in g.rewards]
        if own_rewards:
            self.own_reward = self._ema(self.own_reward, sum(own_rewards) / len(own_rewards))
        if external_rewards:
            self.external_reward = self._ema(self.external_reward, sum(external_rewards) / len(external_rewards))

    def _ema(self, old: float | None, new: float) -> float:
        return new if old is None else (1 - self.decay) * old + self.decay * new
