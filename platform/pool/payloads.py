"""The pool's rows as protocol JSON (docs/protocol.md): what `samples` carries."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pool.models import Rollout

_COMPACT = (",", ":")


def rollout_to_protocol(rollout: Rollout) -> dict[str, Any]:
    """A sampled group: verified rewards, and the author node's public name. Needs node loaded."""
    return {
        "id": str(rollout.id),
        "round": rollout.round,
        "task": {"dataset": rollout.dataset, "seed": rollout.seed, "index": rollout.index},
        "question": rollout.question,
        "answer": rollout.answer,
        "completions": rollout.completions,
        "rewards": rollout.verified_rewards,
        "node": rollout.node.name,
    }


def rollout_protocol_json(rollout: Rollout) -> str:
    """rollout_to_protocol as JSON text."""
    return json.dumps(rollout_to_protocol(rollout), separators=_COMPACT)


def hit_protocol_json(row: Sequence[Any]) -> str:
    """The protocol JSON of a group from the sampling draw's row (pool.selectors._DRAW_SQL: name at 3,
    then id, node_id, round, dataset, seed, index, question, answer, completions, verified_rewards):
    the same object as rollout_to_protocol, the completions and rewards as PostgreSQL wrote their jsonb
    (valid JSON, the value the pool stored), not parsed and dumped again."""
    name, rollout_id, _node_id, round_, dataset, seed, index, question, answer, completions, rewards = row[3:14]
    head = json.dumps(
        {
            "id": str(rollout_id),
            "round": round_,
            "task": {"dataset": dataset, "seed": seed, "index": index},
            "question": question,
            "answer": answer,
        },
        separators=_COMPACT,
    )
    return (
        f'{head[:-1]},"completions":{_json_text(completions)},"rewards":{_json_text(rewards)},'
        f'"node":{json.dumps(name)}}}'
    )


def _json_text(value: Any) -> str:
    """A jsonb column's value as JSON text (psycopg hands Django's connections jsonb as text)."""
    return value if isinstance(value, str) else json.dumps(value, separators=_COMPACT)
