"""autobahn, the WebSocket frame layer under daphne: two changes to its module globals.

`format_debug_lazily`: autobahn makes the text of its debug log lines whether or not debug logging is
on: it pretty-prints every new connection's options, and colours a method's name, the peer and a
length with click for every chunk received and every frame sent (`hltype`, `hlval`: four
`click.style` calls each time, and a lost connection's whole traceback as text), a visible part of
the server's CPU per socket. Here that text is made only if a log line formats it
(docs/benchmarks.md, "Sockets").

`unmask_with_websockets`: every frame a client sends is masked; autobahn makes a new CFFI masker for
each frame (an import, two allocations and a finaliser). The `websockets` library's C `apply_mask`
does the same XOR without them (docs/benchmarks.md, "Sockets").

Both replace a global that autobahn's modules look up when they run: `moved()` checks they still do.
"""

from __future__ import annotations

from collections.abc import Callable
from pprint import pformat
from typing import Any

from common.library_patches._inspect import names_used, names_used_in_module

try:
    from websockets.speedups import apply_mask
except ImportError:  # a pure-Python websockets: autobahn's maskers stay
    apply_mask = None


class _FormattedWhenLogged:
    """`make(*args)`, called when a log line formats it (never, with debug logging off)."""

    __slots__ = ("args", "make")

    def __init__(self, make: Callable[..., str], *args: Any) -> None:
        self.make, self.args = make, args

    def __format__(self, spec: str) -> str:
        return format(self.make(*self.args), spec)

    def __str__(self) -> str:
        return self.make(*self.args)

    __repr__ = __str__


def _pformat_for_debug_logs(value: Any, *args: Any, **kwargs: Any) -> Any:
    # The one list autobahn.websocket.protocol pretty-prints is the options of a new connection, for
    # `log.debug`; its other uses (dicts) are __str__ methods, which must return a real string.
    if isinstance(value, list) and not args and not kwargs:
        return _FormattedWhenLogged(pformat, value)
    return pformat(value, *args, **kwargs)


def _when_logged(make: Callable[..., str]) -> Callable[..., _FormattedWhenLogged]:
    def lazily(*args: Any) -> _FormattedWhenLogged:
        return _FormattedWhenLogged(make, *args)

    return lazily


def format_debug_lazily() -> None:
    """Make autobahn's debug text only when a log line uses it. The two modules that serve sockets
    use `hltype` and `hlval` only for the keyword arguments of `log.debug`."""
    from autobahn import util
    from autobahn.twisted import websocket as twisted_websocket
    from autobahn.websocket import protocol

    protocol.pformat = _pformat_for_debug_logs
    for module in (protocol, twisted_websocket):
        module.hltype = _when_logged(util.hltype)
        module.hlval = _when_logged(util.hlval)


class _Unmasker:
    """autobahn's masker interface (`process` chunk after chunk of one frame, `pointer`, `reset`) on
    `websockets.speedups.apply_mask`."""

    __slots__ = ("_masks", "_offset")

    def __init__(self, mask: bytes) -> None:
        mask = bytes(mask)
        self._masks = [mask[k:] + mask[:k] for k in range(4)]  # the key rotated to each offset
        self._offset = 0

    def pointer(self) -> int:
        return self._offset

    def reset(self) -> None:
        self._offset = 0

    def process(self, data: bytes) -> bytes:
        mask = self._masks[self._offset & 3]
        self._offset += len(data)
        return apply_mask(data, mask)


def _unmasker(mask: bytes, length: int | None = None) -> _Unmasker:
    return _Unmasker(mask)


def unmask_with_websockets() -> None:
    """Mask and unmask WebSocket frames with `websockets`' C `apply_mask` (when its speedups are
    built: a wheel without them keeps autobahn's maskers)."""
    if apply_mask is None:
        return
    from autobahn.websocket import protocol

    protocol.create_xor_masker = _unmasker


def moved() -> list[str]:
    """What the two changes rely on that this autobahn no longer has where they expect it."""
    from autobahn import util
    from autobahn.twisted import websocket as twisted_websocket
    from autobahn.websocket import protocol, xormasker

    found = []
    if not callable(getattr(util, "hltype", None)) or not callable(getattr(util, "hlval", None)):
        found.append("autobahn.util.hltype / hlval are gone")
    for module in (protocol, twisted_websocket):
        used = names_used_in_module(module)
        for name in ("hltype", "hlval") if module is twisted_websocket else ("hltype", "pformat"):
            if name not in used or not hasattr(module, name):
                found.append(f"{module.__name__} no longer calls its global {name}: its debug text is made again")
    reader = getattr(getattr(protocol, "WebSocketProtocol", None), "processData", None)
    if reader is None or "create_xor_masker" not in names_used(reader):
        found.append(
            "autobahn.websocket.protocol.WebSocketProtocol.processData no longer calls the module's "
            "create_xor_masker: frames are unmasked by autobahn's own maskers"
        )
    masker = xormasker.create_xor_masker(b"\x01\x02\x03\x04", 4)
    if not all(callable(getattr(masker, name, None)) for name in ("process", "pointer", "reset")):
        found.append("autobahn's maskers no longer have process / pointer / reset, as _Unmasker does")
    return found
