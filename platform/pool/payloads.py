"""A `samples` reply's groups (docs/protocol.md, "samples"): one record per group drawn, and its JSON."""

from __future__ import annotations

import uuid
from typing import Any, NamedTuple, get_args, get_origin

import msgspec

from common.compact_json import Raw, dumps, dumps_object
from pool.models import Rollout
from pool.records import flat_fields
from sapo_node.protocol import SampledWireGroup

#: A sampled group's fields as the pool holds them (SampledWireGroup's, the task's in its place).
SAMPLED_FIELDS = flat_fields(SampledWireGroup)


class SampledGroup(NamedTuple):
    """A group drawn for a `samples` reply: SAMPLED_FIELDS (asserted below), its rewards the verified
    ones, then its author's node id (for moderation's weighting and the served record; the reply does
    not carry it). From the draw's row (pool.sampling) or from a Rollout (its later rounds).
    `completions`, `rewards` and `proof` are JSON text as PostgreSQL wrote the jsonb (the draw's raw
    cursor), or the values (a Rollout's)."""

    id: uuid.UUID
    round: int
    dataset: str
    seed: int
    index: int
    question: str
    answer: str | None
    completions: Any
    rewards: Any
    proof: Any
    node: str
    node_id: int

    @classmethod
    def of_rollout(cls, rollout: Rollout) -> SampledGroup:
        """A Rollout with `node` loaded, as a sampled group."""
        r = rollout
        return cls(
            id=r.id,
            round=r.round,
            dataset=r.dataset,
            seed=r.seed,
            index=r.index,
            question=r.question,
            answer=r.answer,
            completions=r.completions,
            rewards=r.verified_rewards,
            proof=r.proof,
            node=r.node.name,
            node_id=r.node_id,
        )


assert SampledGroup._fields == (*SAMPLED_FIELDS, "node_id"), "SampledGroup holds SampledWireGroup's fields"

#: The reply's members in SampledWireGroup's order, each with the fields of a nested Struct (the task's,
#: written as an object of them) or None.
_MEMBERS = tuple(
    (field.name, flat_fields(field.type) if field.name not in SAMPLED_FIELDS else None)
    for field in msgspec.structs.fields(SampledWireGroup)
)


def _is_json(kind: Any) -> bool:
    """Whether a member of this type is stored in a jsonb column: a list, or a Struct kept whole (a proof)."""
    return get_origin(kind) is list or (isinstance(kind, type) and issubclass(kind, msgspec.Struct))


#: The members stored in jsonb columns (lists, and Structs kept whole), so read as JSON text.
_JSON_MEMBERS = tuple(
    field.name
    for field in msgspec.structs.fields(SampledWireGroup)
    if field.name in SAMPLED_FIELDS and any(map(_is_json, (field.type, *get_args(field.type))))
)


def sampled_group_json(group: SampledGroup) -> str:
    """The group's protocol object (sapo_node.protocol.SampledWireGroup) as JSON text. A `sample` is
    answered often and its groups' completions are most of its bytes, so the jsonb columns are written
    as PostgreSQL wrote them, not parsed and dumped again (docs/benchmarks.md, "Sockets");
    tests/platform/test_sampling.py compares the result with the object built field by field and
    encoded by json."""
    values = group._asdict()
    values["id"] = str(group.id)
    for name in _JSON_MEMBERS:
        values[name] = _json_text(values[name])
    return dumps_object(
        {name: values[name] if nested is None else {k: values[k] for k in nested} for name, nested in _MEMBERS}
    )


def _json_text(value: Any) -> Raw:
    """A jsonb column's value as JSON text (psycopg hands Django's connections jsonb as text)."""
    return Raw(value if isinstance(value, str) else dumps(value))
