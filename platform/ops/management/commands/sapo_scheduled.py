"""`python manage.py sapo_scheduled [--only NAME ...] [--every SECONDS]`: the site's scheduled work
(ops.scheduled.JOBS), once, or in a loop for a compose service or `make run`."""

from __future__ import annotations

import time

from django.core.management.base import BaseCommand, CommandError

from ops.scheduled import JOBS, run_jobs


class Command(BaseCommand):
    help = "Run the site's scheduled jobs once (for cron), or every --every seconds."

    def add_arguments(self, parser):
        parser.add_argument("--only", action="append", choices=[name for name, _ in JOBS], help="Run this job only.")
        parser.add_argument("--every", type=float, default=0.0, help="Repeat every SECONDS (0: run once and exit).")

    def handle(self, *args, only, every, **options):
        while True:
            results = run_jobs(only)
            for r in results:
                self.stdout.write(f"{r.name}: {'ok' if r.ok else 'FAILED'} in {r.seconds:.2f} s: {r.message}")
            if not every:
                if not all(r.ok for r in results):
                    raise CommandError("some scheduled jobs failed")
                return
            time.sleep(every)
