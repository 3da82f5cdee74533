"""The site's scheduled work, run by one command an operator schedules: `manage.py sapo_scheduled`.

Each job is a function that takes no argument and returns a short line for the log. Jobs are named
here by dotted path, in the order they run, so that this (top) layer is the only one that knows the
whole list and a job's app stays importable on its own. A job that raises is logged and the next
jobs still run; the command's exit status says whether any failed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module

log = logging.getLogger(__name__)

#: (name, "module.function"), in the order they run.
JOBS: list[tuple[str, str]] = [
    ("fold", "figures.stats.stats_fold_job"),
    ("badges", "figures.badges.badges_assign_job"),
    ("export", "figures.export.stats_export_job"),
    ("retention", "pool.retention.retention_job"),
    ("alerts", "alerts.jobs.run"),
    ("audits", "audits.jobs.audit_sweep_job"),
]


@dataclass(frozen=True)
class JobResult:
    name: str
    ok: bool
    seconds: float
    message: str


def job_function(path: str) -> Callable[[], str]:
    module, _, name = path.rpartition(".")
    return getattr(import_module(module), name)


def run_jobs(names: list[str] | None = None) -> list[JobResult]:
    """Run the jobs (all, or those named, in JOBS' order) and say how each went."""
    known = [name for name, _ in JOBS]
    unknown = sorted(set(names or ()) - set(known))
    if unknown:
        raise ValueError(f"unknown jobs {unknown}: choose from {known}")
    results = []
    for name, path in JOBS:
        if names and name not in names:
            continue
        started = time.monotonic()
        try:
            message, ok = str(job_function(path)()), True
        except Exception as exc:  # one failing job must not stop the others
            log.exception("scheduled job %s failed", name)
            message, ok = f"{type(exc).__name__}: {exc}", False
        results.append(JobResult(name, ok, round(time.monotonic() - started, 3), message))
    return results
