"""`manage.py sapo_audit_worker`: a worker process that replays uploaded audits (docs/audits.md).

With REDIS_URL it is an RQ worker on the audits' queue (a SimpleWorker: the job runs in this process,
which holds no database connection across a fork); without, it takes uploaded audits from PostgreSQL
every --poll seconds. Either way it runs the sweep between jobs, so expired audits and lost jobs are
handled even where no scheduler runs. Run as many as the audits' CPU may take: each uses one core.
"""

from __future__ import annotations

import logging
import time

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import close_old_connections

from audits import jobs

log = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "Replay uploaded audits: an RQ worker on REDIS_URL, else a PostgreSQL poller."

    def add_arguments(self, parser):
        parser.add_argument("--burst", action="store_true", help="Stop once no job is waiting.")
        parser.add_argument("--poll", type=float, default=2.0, help="Seconds between looks without Redis.")

    def handle(self, *args, burst: bool, poll: float, **options):
        self.stdout.write(jobs.audit_sweep_job())
        if settings.REDIS_URL:
            self._rq(burst=burst)
        else:
            self._poll(burst=burst, every=poll)

    def _rq(self, *, burst: bool) -> None:
        from rq import Queue, SimpleWorker

        connection = jobs.redis_for_queue(blocking=True)
        worker = SimpleWorker([Queue(jobs.queue_name(), connection=connection)], connection=connection)
        self.stdout.write(f"audit worker on RQ queue {jobs.queue_name()!r}")
        worker.work(burst=burst, with_scheduler=False)

    def _poll(self, *, burst: bool, every: float) -> None:
        self.stdout.write("audit worker polling PostgreSQL (no REDIS_URL)")
        last_sweep = time.monotonic()
        while True:
            close_old_connections()
            waiting = jobs.audits_waiting()
            for audit_id in waiting:
                try:
                    self.stdout.write(jobs.audit_run(audit_id))
                except Exception:  # noqa: BLE001 - recorded on the audit (jobs.audit_run); the next one goes on
                    log.exception("audit %s: its job failed", audit_id)
            if time.monotonic() - last_sweep > 60:
                jobs.audit_sweep()
                last_sweep = time.monotonic()
            if burst and not waiting:
                return
            if not waiting:
                time.sleep(every)
