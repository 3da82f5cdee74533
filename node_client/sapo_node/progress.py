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
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
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
        bar = tqdm(iterable, total=total, desc=desc, unit=unit, initial=initial, file=file, **tqdm_kwargs)
    else:
        bar = LineProgress(iterable, total=total, desc=desc, unit=unit, initial=initial, file=file, every=every)
    _open_bars.append((weakref.ref(bar), time.monotonic()))
    del _open_bars[:-8]
    return bar


@dataclass(frozen=True)
class BarState:
    """Where a bar stands: its description, the amount done, its total (None: unknown), the seconds
    it has run, and the seconds left at its pace so far (None until it has a pace and a total)."""

    desc: str
    n: float
    total: float | None
    elapsed: float
    eta: float | None


#: The bars progress_bar made (a weak reference and when it was made), newest last: what a node
#: shows the site while it prepares its model (sapo_node.preparing) is the newest open one.
_open_bars: list[tuple[weakref.ref, float]] = []


def current_bar() -> BarState | None:
    """The newest bar that is still open (another thread may read it), or None."""
    for ref, started in reversed(list(_open_bars)):
        bar = ref()
        if bar is None or getattr(bar, "closed", False) or getattr(bar, "disable", False):
            continue  # a LineProgress says `closed`, a tqdm bar `disable` once closed
        elapsed, n, total = time.monotonic() - started, float(bar.n), bar.total
        eta = (total - n) * elapsed / n if total and n > 0 and elapsed > 0 else None
        return BarState(str(bar.desc), n, total, elapsed, max(eta, 0.0) if eta is not None else None)
    return None


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
        done = _amount(self.n) + (f"/{_amount(self.total)}" if self.total is not None else "")
        rate = f", {self.n / elapsed:.3g} {self.unit}/s" if elapsed > 0 and self.n else ""
        if rate and self.total is not None and self.n < 0.999 * self.total:  # not the float sum's last crumbs
            rate += f", ETA {duration((self.total - self.n) * elapsed / self.n)}"
        line = f"{self.desc}: {done} {self.unit} ({elapsed:.0f} s{rate})"
        print(f"{line} {self.postfix}".rstrip(), file=self.file, flush=True)
        self.last_line = time.monotonic()
        self._done_at_last_line = self.n


def _amount(n: float) -> str:
    """A count as is, a fractional amount (megabytes) to one decimal."""
    return f"{n:g}" if float(n).is_integer() else f"{n:.1f}"


#: A phase that takes at least this many seconds gets a line of its own in plain output.
PHASE_LINE_AFTER = 1.0


class RoundProgress:
    """The console's account of a run's rounds. On a terminal, a live bar whose description names
    the round and its current phase. Elsewhere (docker logs, a parent process reading the output)
    plain lines on stdout: one when a phase of PHASE_LINE_AFTER seconds or more ends, so a real
    model's minutes-long generation is not silence, then one per round with its figures, its
    phases' times and, when the run has a last round, the time left."""

    def __init__(self, first: int, last: int, *, enabled: bool | None = None) -> None:
        self.live = is_terminal(sys.stderr) if enabled is None else enabled
        self.last = last
        self.round_seconds: list[float] = []
        self.current: tuple[int, str, float] | None = None  # round, phase, when it began
        total = last if last > 0 else None
        # Without a total tqdm writes `desc: 10round [...]`: the description already names the round.
        bar_format = None if total else "{desc} [{elapsed}{postfix}]"
        self.bar = progress_bar(
            total=total,
            initial=first - 1,
            unit="round",
            live=True,
            disable=not self.live,
            bar_format=bar_format,
        )

    def phase(self, round: int, phase: str) -> None:
        if self.live:
            # set_description would add ": ", which tqdm writes before the count of a bar without a total
            self.bar.set_description_str(f"round {round}: {phase}", refresh=True)
            return
        self._phase_ended()
        self.current = (round, phase, time.monotonic())

    def done(self, row: dict[str, Any]) -> None:
        figures = {
            "reward": f"{row['reward_mean']:.3f}",
            "kept": f"{row['local_kept']}+{row['external_kept']}",
            "shares": f"{row['accepted']}ok/{row['rejected']}rej",
            "tok_s": f"{row['tokens_per_s']:.0f}",
            "net": row["connection"],
        }
        if row.get("refused"):  # groups never sent: not the pool's rejections, which the site shows
            figures["refused_locally"] = str(row["refused"])
        if self.live:
            self.bar.set_postfix(**figures, refresh=False)
            self.bar.update(1)
            return
        self._phase_ended()
        self.current = None
        seconds = row["seconds"]
        self.round_seconds.append(seconds["total"])
        phases = ", ".join(f"{name} {s:.1f} s" for name, s in seconds.items() if name != "total")
        of = f"/{self.last}" if self.last > 0 else ""
        line = " ".join(f"{k}={v}" for k, v in figures.items())
        line = f"round {row['round']}{of}: {line}; round {seconds['total']:.1f} s ({phases})"
        if self.last > row["round"]:
            left = (self.last - row["round"]) * sum(self.round_seconds) / len(self.round_seconds)
            line += f"; ETA {duration(left)}"
        print(line, flush=True)

    def close(self) -> None:
        self.bar.close()

    def _phase_ended(self) -> None:
        if self.current is None:
            return
        round, phase, began = self.current
        seconds = time.monotonic() - began
        if seconds >= PHASE_LINE_AFTER:
            print(f"round {round}: {phase} {seconds:.1f} s", flush=True)


def duration(seconds: float) -> str:
    """12 s, 4 min, 2.5 h: a time left, as precise as anyone reads it."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
