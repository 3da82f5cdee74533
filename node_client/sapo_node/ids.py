"""Group ids: UUIDv7 (RFC 9562, section 5.7), time-ordered, chosen by the node that made the group.

The first 48 bits are the Unix time in milliseconds, then the version (7), 12 random bits, the variant
(0b10) and 62 random bits. Ids made later sort later, so the pool's ledger is partitioned by id ranges
that are time ranges (docs/architecture.md, "The pool's storage"), and its B-tree takes new ids at its
right edge. The server takes an id whose time lies in the bounds of `protocol.ID_MAX_AGE_SECONDS` and
`protocol.ID_MAX_AHEAD_SECONDS` around its clock (docs/protocol.md, "share"). Plain functions, no
dependencies: the server imports them too.
"""

from __future__ import annotations

import os
import time
import uuid
from datetime import datetime

_VERSION_7 = 0x7 << 76
_VARIANT = 0b10 << 62
#: Seconds to add to this machine's clock to read the server's: set from a welcome's `server_time`, so
#: a node whose clock is off by more than the server's bounds still makes ids the server takes (a fresh
#: id of a wrong clock would be refused again, and the group re-keyed, for ever).
_clock_offset = 0.0
#: This machine's clock (Unix seconds).
_wall = time.time


def clock_set(server_time: float, *, local_time: float | None = None) -> float:
    """Make the ids that follow from the server's clock, `server_time` (Unix seconds) read at
    `local_time` (default: now); returns the offset."""
    global _clock_offset
    _clock_offset = float(server_time) - (_wall() if local_time is None else local_time)
    return _clock_offset


def uuid7(at: datetime | float | None = None) -> uuid.UUID:
    """A fresh UUIDv7 for the time `at` (a datetime, or Unix seconds; None: now, by the server's clock
    once a welcome told it)."""
    ms = _ms(_wall() + _clock_offset if at is None else at)
    rand = int.from_bytes(os.urandom(10), "big")  # 80 bits: 12 after the version, 62 after the variant
    return uuid.UUID(int=(ms << 80) | _VERSION_7 | ((rand >> 62) & 0xFFF) << 64 | _VARIANT | (rand & (1 << 62) - 1))


def uuid7_floor(at: datetime | float) -> uuid.UUID:
    """The smallest UUIDv7 of the millisecond `at`: every id made at or after `at` sorts at or above it,
    every id made before it below it (PostgreSQL compares uuids byte by byte, as these ints compare)."""
    return uuid.UUID(int=(_ms(at) << 80) | _VERSION_7 | _VARIANT)


def is_uuid7(value: uuid.UUID) -> bool:
    """Version 7 and the RFC's variant (read from the bits: uuid.UUID's properties cost more)."""
    bits = value.int
    return (bits >> 76) & 0xF == 7 and (bits >> 62) & 0x3 == 0b10


def _ms(at: datetime | float) -> int:
    seconds = at.timestamp() if isinstance(at, datetime) else float(at)
    return int(seconds * 1000) & (1 << 48) - 1
