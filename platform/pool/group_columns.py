"""Where the pool stores a group: each of its fields (pool.records.GROUP_FIELDS, the protocol's names)
in the column of that name, in the texts (pool_rollouttext, aliased `t`) for TEXT_FIELDS and in the
ledger (pool_rollout, `r`) for the others; its rewards twice, as claimed and as verified. For the
statements that read groups back with those aliases (pool.sampling's draw, pool.retention's archive);
the INSERT that writes them is pool.ingest_statement's."""

from __future__ import annotations

from pool.models import Rollout, RolloutText
from pool.records import GROUP_FIELDS

#: A column: (table alias, column name).
Column = tuple[str, str]

#: The texts, kept apart from the ledger: partitioned by day and aged out (pool.retention).
TEXT_FIELDS = ("question", "answer", "completions", "proof")
CLAIMED_REWARDS: Column = ("r", "claimed_rewards")
#: A group read back for training (a sample) carries the verified rewards.
VERIFIED_REWARDS: Column = ("r", "verified_rewards")

GROUP_COLUMNS: dict[str, Column] = {name: ("t" if name in TEXT_FIELDS else "r", name) for name in GROUP_FIELDS}
GROUP_COLUMNS["rewards"] = VERIFIED_REWARDS


def _columns_exist() -> bool:
    """Whether each column is its model's field of that name; a field of the protocol with no column
    raises FieldDoesNotExist, naming it."""
    models = {"r": Rollout, "t": RolloutText}
    columns = (*GROUP_COLUMNS.values(), CLAIMED_REWARDS)
    return all(models[table]._meta.get_field(column).column == column for table, column in columns)


assert _columns_exist(), "a field of a group is stored under another column name"
