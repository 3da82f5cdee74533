"""Folded figures of the pool, so that pages never scan it (docs/figures.md).

The pool's groups, consumptions and round reports are folded into these small tables by
`figures.stats.stats_fold`, incrementally: rows older than FOLD_LAG are added once, in order of time
(groups) or id (consumptions, reports), and `StatsCursor` remembers how far the fold got. Readers add
the few rows newer than the cursor on the fly (figures.leaderboard), in the same snapshot.
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class StatsCursor(models.Model):
    """One row (id=1): how far the pool has been folded into NodeStats / NodeHour / DatasetHour."""

    folded_until = models.DateTimeField(help_text="Groups created before this are in the totals.")
    consumption_id = models.BigIntegerField(default=0, help_text="Consumption rows with id <= this are counted.")
    round_id = models.BigIntegerField(default=0, help_text="NodeRound rows with id <= this are counted.")
    updated_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"folded until {self.folded_until:%Y-%m-%d %H:%M:%S}"


class NodeStats(models.Model):
    """A node's totals since it joined (folded part only; see the module docstring)."""

    node = models.OneToOneField("nodes.Node", on_delete=models.CASCADE, primary_key=True, related_name="stats")
    accepted_groups = models.PositiveIntegerField(default=0)
    rejected_groups = models.PositiveIntegerField(default=0)
    moderated_groups = models.PositiveIntegerField(default=0, help_text="Accepted, then taken out by moderation.")
    credited_completions = models.PositiveIntegerField(default=0)
    verified_reward = models.FloatField(default=0.0, help_text="Sum of verified rewards of credited groups.")
    credit_growth = models.FloatField(
        default=0.0, help_text="Sum of each credited reward times its decay weight (figures.credit.growth_of)."
    )
    helped = models.PositiveIntegerField(default=0, help_text="(other node, group) pairs that trained on its groups.")
    rounds = models.PositiveIntegerField(default=0, help_text="Round reports received (self-reported).")

    def __str__(self) -> str:
        return f"stats of node {self.node_id}"


class NodeSwarmStats(models.Model):
    """A node's totals in one swarm (folded part only): the per-swarm leaderboard. Folded with
    NodeStats from the same rows, so a node's rows over its swarms add up to its NodeStats."""

    node = models.ForeignKey("nodes.Node", on_delete=models.CASCADE, related_name="+", db_index=False)
    swarm = models.ForeignKey("swarms.Swarm", on_delete=models.PROTECT, related_name="+")
    accepted_groups = models.PositiveIntegerField(default=0)
    rejected_groups = models.PositiveIntegerField(default=0)
    moderated_groups = models.PositiveIntegerField(default=0)
    credited_completions = models.PositiveIntegerField(default=0)
    verified_reward = models.FloatField(default=0.0)
    credit_growth = models.FloatField(default=0.0)
    helped = models.PositiveIntegerField(default=0)
    rounds = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["node", "swarm"], name="figures_nodeswarmstats_unique")]

    def __str__(self) -> str:
        return f"stats of node {self.node_id} in swarm {self.swarm_id}"


class NodeHour(models.Model):
    """A node's shared groups per hour: its verified-reward curve."""

    node = models.ForeignKey("nodes.Node", on_delete=models.CASCADE, related_name="hours")
    hour = models.DateTimeField()
    accepted_groups = models.PositiveIntegerField(default=0)
    rejected_groups = models.PositiveIntegerField(default=0)
    credited_completions = models.PositiveIntegerField(default=0)
    verified_reward = models.FloatField(default=0.0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["node", "hour"], name="figures_nodehour_unique")]

    def __str__(self) -> str:
        return f"node {self.node_id} at {self.hour:%Y-%m-%d %H}h"


class NodeSwarmHour(models.Model):
    """A node's groups per hour in one swarm: a team's figures in that swarm (figures.teams)."""

    node = models.ForeignKey("nodes.Node", on_delete=models.CASCADE, related_name="+", db_index=False)
    swarm = models.ForeignKey("swarms.Swarm", on_delete=models.PROTECT, related_name="+")
    hour = models.DateTimeField()
    accepted_groups = models.PositiveIntegerField(default=0)
    rejected_groups = models.PositiveIntegerField(default=0)
    credited_completions = models.PositiveIntegerField(default=0)
    verified_reward = models.FloatField(default=0.0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["node", "swarm", "hour"], name="figures_nodeswarmhour_unique")]

    def __str__(self) -> str:
        return f"node {self.node_id} in swarm {self.swarm_id} at {self.hour:%Y-%m-%d %H}h"


class DatasetHour(models.Model):
    """A swarm's groups per hour and dataset: the swarm pages' charts (a site's total is the sum over
    its swarms)."""

    swarm = models.ForeignKey("swarms.Swarm", on_delete=models.PROTECT, related_name="+", db_index=False)
    hour = models.DateTimeField()
    dataset = models.CharField(max_length=64)
    accepted_groups = models.PositiveIntegerField(default=0)
    rejected_groups = models.PositiveIntegerField(default=0)
    credited_completions = models.PositiveIntegerField(default=0)
    verified_reward = models.FloatField(default=0.0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["swarm", "hour", "dataset"], name="figures_datasethour_swarm_unique")
        ]

    def __str__(self) -> str:
        return f"{self.dataset} of swarm {self.swarm_id} at {self.hour:%Y-%m-%d %H}h"
