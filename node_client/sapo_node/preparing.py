"""What a node tells the site while it prepares its model, before round 1.

A node says hello before it loads its model, so the site shows it "preparing" (not offline) for as long
as a download or a build takes. Meanwhile a thread reads the newest progress bar (sapo_node.progress)
every few seconds and tells the transport what the node does, how far it is and its ETA: the `status`
frame's `preparing`, `progress` and `eta_seconds` (docs/protocol.md, "status").
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from sapo_node import protocol
from sapo_node.progress import BarState, current_bar
from sapo_node.transport import Preparing, Transport

#: Seconds between two readings of the bar: a status frame goes only when the reading changed.
EVERY = 5.0


def preparing_of(bar: BarState | None) -> Preparing:
    """What a bar's description says the node does: a prebuilt model's download (sapo_node.prebuilt's
    "downloading <model>") or a built-in model's warm start (sapo_node.tiny's "warm start <model>");
    anything else, or no bar, is loading (a hub model, a conversion, reading the cache)."""
    if bar is None:
        return Preparing(protocol.PREPARING_LOAD)
    if bar.desc.startswith("downloading"):
        step = protocol.PREPARING_DOWNLOAD
    elif bar.desc.startswith("warm start"):
        step = protocol.PREPARING_BUILD
    else:
        step = protocol.PREPARING_LOAD
    progress = min(bar.n / bar.total, 1.0) if bar.total else None
    return Preparing(step, progress, round(bar.eta) if bar.eta is not None else None)


@contextmanager
def telling_preparing(transport: Transport, every: float = EVERY) -> Iterator[None]:
    """Tell `transport` what the node prepares, every `every` seconds, while the block runs."""
    done = threading.Event()

    def tell() -> None:
        while True:
            transport.tell_state(protocol.NODE_PREPARING, preparing=preparing_of(current_bar()))
            if done.wait(every):
                return

    thread = threading.Thread(target=tell, name="sapo-preparing", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=every + 1)
