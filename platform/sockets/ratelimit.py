"""A node's frame budgets: messages, frame bytes and server CPU, each per minute, counted across
every connection of the node.

Each budget is a token bucket that holds one minute's allowance and refills continuously (the
allowance / 60 every second). A frame is admitted when the message bucket holds a whole message,
the byte bucket the frame's size (a full bucket for a frame larger than a minute's allowance), and
the CPU bucket is not in debt; every frame, admitted or refused, then takes one message and its bytes
out, and the server CPU an admitted frame cost is taken out of the CPU bucket after it was handled
(with the node's next frame: `admit(..., cpu_ms=)`; CPU is only known afterwards). A bucket may go
into debt down to minus its allowance, so one expensive frame delays the next by what it overspent
(debt / refill rate), and a node that keeps sending while refused stays refused; after two minutes
of silence any node is back to a full minute.

Why buckets, not a fixed one-minute window: a node cannot send its allowance at the end of one
minute and again at the start of the next, and what a burst gets does not depend on where it falls in
the minute (docs/benchmarks.md, "Attacks on verification").

With REDIS_URL set (a multi-process deployment: the channel layer is Redis too) the buckets live in
Redis, one hash per node updated by one script (one round trip a frame), so they hold across
connections and server processes. Without REDIS_URL the deployment is one process (the in-memory
channel layer cannot span processes), and an in-process table with the same arithmetic is exact.
While Redis is down, each process counts in that table instead (a node's allowance then holds per
process, not across them): the server's outage never refuses a node's frame, and while the process
counts Redis as down only one frame a second waits to try it (common.outage).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from django.conf import settings
from redis.exceptions import RedisError

from common import outage
from common.loops import per_loop
from common.redis_client import async_pool

#: Seconds a node's buckets are kept after its last frame: long enough to refill from the deepest debt.
KEEP_SECONDS = 180

# KEYS[1]: the node's hash. ARGV: now (s), then per bucket (messages, bytes, CPU ms) its allowance per
# minute and this frame's cost (the CPU cost is the previous frame's). Returns 1 when refused.
_ADMIT_LUA = """
local now = tonumber(ARGV[1])
local state = redis.call('HMGET', KEYS[1], 't', 'm', 'b', 'c')
local elapsed = math.max(0, now - (tonumber(state[1]) or now))
local levels, open = {}, true
for i = 1, 3 do
    local allowance, cost = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
    local level = math.min(allowance, (tonumber(state[i + 1]) or allowance) + elapsed * allowance / 60)
    if i == 3 then level = math.max(-allowance, level - cost) end
    levels[i] = level
end
-- a whole message, the frame's bytes (or a full bucket for a frame larger than a minute's), no CPU debt
local need_bytes = math.min(tonumber(ARGV[5]), tonumber(ARGV[4]))
if levels[1] < tonumber(ARGV[3]) or levels[2] < need_bytes or levels[3] <= 0 then open = false end
for i = 1, 2 do
    levels[i] = math.max(-tonumber(ARGV[2 * i]), levels[i] - tonumber(ARGV[2 * i + 1]))
end
redis.call('HSET', KEYS[1], 't', tostring(now), 'm', tostring(levels[1]), 'b', tostring(levels[2]),
           'c', tostring(levels[3]))
redis.call('EXPIRE', KEYS[1], ARGV[8])
if open then return 0 end
return 1
"""


@dataclass
class _Buckets:
    at: float
    levels: list[float]


_local: dict[int, _Buckets] = {}
#: Table size that triggers the next sweep of nodes silent for KEEP_SECONDS (doubles while they are active).
_sweep_above = 10_000


def _new_script():
    import redis.asyncio as aioredis

    return aioredis.Redis(connection_pool=async_pool(settings.REDIS_URL)).register_script(_ADMIT_LUA)


#: The admission script, on one asyncio Redis client per event loop (clients are bound to the loop
#: that made them).
_script = per_loop(_new_script)


def _key(node_id: int) -> str:
    return f"{settings.SAPO_REDIS_PREFIX}:budget:{node_id}"


def _admit_local(node_id: int, now: float, allowances: tuple[int, int, int], costs: tuple[int, int, int]) -> bool:
    """The script's arithmetic, for one process."""
    global _sweep_above
    buckets = _local.get(node_id)
    if buckets is None:
        if len(_local) > _sweep_above:  # forget nodes silent for long enough to be full again
            for old in [n for n, b in _local.items() if now - b.at > KEEP_SECONDS]:
                del _local[old]
            _sweep_above = max(10_000, 2 * len(_local))  # not a whole-table sweep per new node
        buckets = _local[node_id] = _Buckets(at=now, levels=[float(a) for a in allowances])
    elapsed = max(0.0, now - buckets.at)
    levels = [min(a, level + elapsed * a / 60) for a, level in zip(allowances, buckets.levels, strict=True)]
    levels[2] = max(-allowances[2], levels[2] - costs[2])
    admitted = levels[0] >= costs[0] and levels[1] >= min(costs[1], allowances[1]) and levels[2] > 0
    for i in (0, 1):
        levels[i] = max(-allowances[i], levels[i] - costs[i])
    buckets.at, buckets.levels = now, levels
    return admitted


@dataclass(frozen=True)
class Budget:
    """A node's allowances per minute: frames, frame bytes, milliseconds of server CPU."""

    messages: int
    bytes: int
    cpu_ms: int


async def _account(node_id: int, budget: Budget, costs: tuple[int, int, int], now: float | None) -> bool:
    now = now if now is not None else time.time()
    allowances = (budget.messages, budget.bytes, budget.cpu_ms)
    if getattr(settings, "REDIS_URL", "") and not outage.REDIS.skip():
        args = [repr(now)]
        for allowance, cost in zip(allowances, costs, strict=True):
            args += [allowance, cost]
        try:
            refused = await _script()(keys=[_key(node_id)], args=[*args, KEEP_SECONDS])
        except RedisError as exc:  # Redis down: this process's own buckets meanwhile (one log line)
            outage.REDIS.failed(exc)
            return _admit_local(node_id, now, allowances, costs)
        outage.REDIS.answered()
        return not int(refused)
    return _admit_local(node_id, now, allowances, costs)


async def admit(node_id: int, budget: Budget, *, size: int, cpu_ms: int = 0, now: float | None = None) -> bool:
    """One frame of `size` bytes from the node: True when it is admitted, False when one of the node's
    buckets is empty. `cpu_ms` is what the node's previous frame cost the server, charged first."""
    return await _account(node_id, budget, (1, size, cpu_ms), now)


async def charge(node_id: int, budget: Budget, cpu_ms: int, now: float | None = None) -> None:
    """Take `cpu_ms` out of the node's CPU bucket with no frame to admit: what the last frame on a
    socket that is closing cost (the socket's next frame would have carried it)."""
    if cpu_ms > 0:
        await _account(node_id, budget, (0, 0, cpu_ms), now)


def reset_local() -> None:
    """Forget in-process buckets (tests)."""
    global _sweep_above
    _local.clear()
    _sweep_above = 10_000
