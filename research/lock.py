"""A study folder's lock: one process writes a study's files at a time.

A study appends every round to rounds.csv as it finishes and rewrites it on `--resume`; a second study
on the same `--out`, or a merge into it (research.merge), would lose rows to the first. Both hold an
exclusive `flock` on the folder's study.lock while they work. The kernel drops it when the process
ends, however it ends, so a killed study leaves no stale lock behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

#: The lock file in a study folder (empty; .gitignore leaves it out of git).
LOCK_FILE = "study.lock"


class StudyBusy(RuntimeError):
    """Another process holds the folder's lock: a study is running there, or a merge into it."""


@contextlib.contextmanager
def study_lock(folder: Path) -> Iterator[None]:
    """Hold `folder`'s lock (made if missing) for the block; StudyBusy at once if another process holds it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StudyBusy(
                f"{folder} is in use by another process (a study running there, or a merge into it): "
                "wait for it, or stop it (Ctrl-C stops a study at its next round boundary)"
            ) from None
        yield
    finally:
        os.close(fd)  # closing the only descriptor releases the lock
