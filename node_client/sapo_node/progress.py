"""Progress of long steps (the tiny models' warm start, rounds, benchmarks, the experiment).

On a terminal a live tqdm bar. Anywhere else (a pipe, a log file, `docker logs`, the prefixed
output of `make run`) a carriage-return bar is noise: every redraw becomes a line of its own. There
`progress_bar` writes plain lines instead, one when it starts, then at most one every `every`
seconds, and one when it ends.

    for step in progress_bar(range(steps), desc="warm start tiny", unit="step"):
        ...
    with progress_bar(total=n, desc="sharing", unit="msg") as bar:
        bar.update(1)
        bar.set_postfix(loss="0.123")
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any, TextIO

from tqdm.auto import tqdm

#: Seconds between two plain lines of the same bar.
LINE_EVERY = 10.0


def is_terminal(file: TextIO) -> bool:
    try:
        return file.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def progress_bar(
    iterable: Iterable | None = None,
    *,
    total: float | None = None,
    desc: str = "",
    unit: str = "it",
    initial: float = 0,
    disable: bool = False,
    file: TextIO | None = None,
    live: bool | None = None,
    every: float = LINE_EVERY,
    **tqdm_kwargs: Any,
) -> Any:
    """A tqdm bar when `file` (default stderr) is a terminal or `live` is True, else a `LineProgress`
    with the same methods (iteration, update, set_description, set_postfix, close, context manager).
    Other keyword arguments (position, leave, ...) go to tqdm."""
    file = file if file is not None else sys.stderr
    if disable:
        return tqdm(iterable, total=total, disable=True)
    if total is None and iterable is not None and hasattr(iterable, "__len__"):
        total = len(iterable)
    if live if live is not None else is_terminal(file):
        tqdm_kwargs.setdefault("dynamic_ncols", True)
        return tqdm(iterable, total=total, desc=desc, unit=unit, initial=initial, file=file, **tqdm_kwargs)
    return LineProgress(iterable, total=total, desc=desc, unit=unit, initial=initial, file=file, every=every)


class LineProgress:
    """tqdm's interface, written as plain lines: `desc: n/total unit (elapsed, rate) key=value ...`."""

    def __init__(
        self,
        iterable: Iterable | None = None,
        *,
        total: float | None,
        desc: str,
        unit: str,
        initial: float,
        file: TextIO,
        every: float,
    ) -> None:
        self.iterable = iterable
        self.total = total
        self.desc = desc
        self.unit = unit
        self.n = initial
        self.file = file
        self.every = every
        self.postfix = ""
        self.started = time.monotonic()
        self.last_line = float("-inf")
        self.closed = False
        self._done_at_last_line = None
        self._write()

    def __iter__(self) -> Iterator:
        try:
            for item in self.iterable or ():
                yield item
                self.update(1)
        finally:
            self.close()

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, n: float = 1) -> None:
        self.n += n
        if time.monotonic() - self.last_line >= self.every:
            self._write()

    def set_description(self, desc: str = "", refresh: bool = True) -> None:
        self.desc = desc

    def set_postfix(self, ordered_dict: dict | None = None, refresh: bool = True, **kwargs: Any) -> None:
        items = {**(ordered_dict or {}), **kwargs}
        self.postfix = " ".join(f"{k}={v}" for k, v in items.items())

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._done_at_last_line != self.n:
            self._write()

    def _write(self) -> None:
        elapsed = time.monotonic() - self.started
        done = f"{self.n:g}" + (f"/{self.total:g}" if self.total is not None else "")
        rate = f", {self.n / elapsed:.3g} {self.unit}/s" if elapsed > 0 and self.n else ""
        line = f"{self.desc}: {done} {self.unit} ({elapsed:.0f} s{rate})"
        print(f"{line} {self.postfix}".rstrip(), file=self.file, flush=True)
        self.last_line = time.monotonic()
        self._done_at_last_line = self.n
