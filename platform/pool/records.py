"""The records a parsed frame hands the pool: a shared group (RolloutIn, its fields GROUP_FIELDS as the
pool stores them) and a round's report. sockets.messages parses and bounds them; ingest, sampling,
verification and moderation's screening read them, and nothing here parses or touches the database."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import msgspec

from sapo_node.protocol import WireGroup, WireProof


def flat_fields(struct: type[msgspec.Struct]) -> tuple[str, ...]:
    """A wire Struct's field names, a nested Struct's (a group's task) replaced by its own: the fields of
    a group as the pool holds it (a row, RolloutIn, pool.payloads.SampledGroup, the archive)."""
    names: list[str] = []
    for field in msgspec.structs.fields(struct):
        nested = isinstance(field.type, type) and issubclass(field.type, msgspec.Struct)
        names += flat_fields(field.type) if nested else [field.name]
    return tuple(names)


#: A group's fields as the pool holds them (sapo_node.protocol.WireGroup's, the task's in its place).
GROUP_FIELDS = flat_fields(WireGroup)


class RolloutIn(msgspec.Struct, frozen=True, kw_only=True):
    """A group as shared, validated: GROUP_FIELDS (asserted below), the id parsed, the lists as tuples.
    A msgspec Struct rather than a frozen dataclass: built 32 times a share, and a frozen dataclass
    sets each field through object.__setattr__, several times slower."""

    id: uuid.UUID
    round: int
    dataset: str
    seed: int
    index: int
    question: str
    answer: str | None
    completions: tuple[str, ...]
    rewards: tuple[float, ...]
    proof: WireProof | None = None


assert RolloutIn.__struct_fields__ == GROUP_FIELDS, "RolloutIn holds sapo_node.protocol.WireGroup's fields"


@dataclass(frozen=True)
class Report:
    ref: str | None
    round: int
    figures: dict[str, float | None]
    used: tuple[uuid.UUID, ...]
