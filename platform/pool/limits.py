"""The protocol's limits, from the settings.

Every limit has an environment variable (docs/protocol.md, "Limits"), read once by config/settings.py
into `settings.SAPO_LIMITS` (a dict of the names set; the others keep the defaults below). This module
reads settings only. Values are taken when a connection opens, so a settings override (tests) applies
to new connections; a swarm overrides some for its nodes (sockets.swarm_places.place_limits). Each swarm
has its catalogue (swarms.SwarmCatalogue).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from sapo_node.protocol import DEFAULT_LIMITS, LIMIT_NAMES

#: See Limits.websocket_max_bytes.
WEBSOCKET_HEADROOM_BYTES = 64 * 1024


@dataclass(frozen=True)
class Limits:
    """The limits in force; each default is the protocol's (sapo_node.protocol.DEFAULT_LIMITS)."""

    max_frame_bytes: int = DEFAULT_LIMITS["max_frame_bytes"]
    max_groups_per_message: int = DEFAULT_LIMITS["max_groups_per_message"]
    max_completions_per_group: int = DEFAULT_LIMITS["max_completions_per_group"]
    max_chars_per_completion: int = DEFAULT_LIMITS["max_chars_per_completion"]
    max_sample_n: int = DEFAULT_LIMITS["max_sample_n"]
    max_used_per_report: int = DEFAULT_LIMITS["max_used_per_report"]
    max_messages_per_minute: int = DEFAULT_LIMITS["max_messages_per_minute"]
    #: Frame bytes a node may send per minute, counted with its messages, before any frame is parsed.
    #: An honest node sends one share of B x G completions a round (64 completions of at most 256
    #: tokens, ~80 KB; the tiny model's ~15 KB at ~100 rounds a minute), a sample and a report: about
    #: 2 MB a minute at the most, so 8 MiB leaves it room (and flushes a backlog at 8 MiB a minute),
    #: while a node sending 1 MiB frames at the message rate is held to 8 of them a minute
    #: (docs/benchmarks.md, "Attacks on verification").
    max_bytes_per_minute: int = DEFAULT_LIMITS["max_bytes_per_minute"]
    #: Server CPU a node's frames may cost per minute (milliseconds of the handling thread's CPU time:
    #: parsing, verification, moderation, the insert), charged after each frame to a bucket refilled
    #: at 50 ms a second (sockets.ratelimit); a node in debt has its frames refused unparsed until the
    #: refill pays it back. A 32-group share costs a few ms of CPU (docs/benchmarks.md, "A share's
    #: fixed cost"); 3,000 ms (5% of a core) bounds what any one node, honest or not, takes from
    #: everyone else per minute. Within a burst the share turns (pool.turns) keep a heavy node from
    #: delaying a light one.
    max_cpu_ms_per_minute: int = DEFAULT_LIMITS["max_cpu_ms_per_minute"]
    max_consecutive_errors: int = DEFAULT_LIMITS["max_consecutive_errors"]
    sample_window_seconds: int = DEFAULT_LIMITS["sample_window_seconds"]
    max_stored_bytes_per_node_hour: int = DEFAULT_LIMITS["max_stored_bytes_per_node_hour"]
    max_stored_bytes_per_contributor_hour: int = DEFAULT_LIMITS["max_stored_bytes_per_contributor_hour"]

    def to_json(self) -> dict[str, int]:
        return asdict(self)

    @property
    def websocket_max_bytes(self) -> int:
        """What the WebSocket layer (daphne) accepts in one message: the frame limit plus headroom, so a
        frame a little over the limit is answered `frame_too_large` (with its ref) on an open socket;
        anything larger closes the connection with 1009 before it is buffered whole."""
        return self.max_frame_bytes + WEBSOCKET_HEADROOM_BYTES


assert tuple(f.name for f in fields(Limits)) == LIMIT_NAMES, "pool.limits.Limits and sapo_node.protocol disagree"
assert Limits().to_json() == DEFAULT_LIMITS, "pool.limits.Limits' defaults are the protocol's"


#: (a copy of the overrides, the Limits made from them): every socket asks for the limits when it opens.
_made: tuple[dict[str, Any], Limits] | None = None


def current_limits() -> Limits:
    """The limits in force: the defaults above, overridden by settings.SAPO_LIMITS."""
    global _made
    overrides: dict[str, Any] = getattr(settings, "SAPO_LIMITS", None) or {}
    made = _made
    if made is not None and made[0] == overrides:
        return made[1]
    unknown = sorted(set(overrides) - set(LIMIT_NAMES))
    if unknown:
        raise ImproperlyConfigured(f"SAPO_LIMITS: unknown limits {unknown}")
    values = {}
    for f in fields(Limits):
        value = int(overrides.get(f.name, f.default))
        if value < 1:
            raise ImproperlyConfigured(f"limit {f.name} must be at least 1, got {value}")
        values[f.name] = value
    limits = Limits(**values)
    _made = (dict(overrides), limits)
    return limits
