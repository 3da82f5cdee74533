"""Re-scan datasets for outlier nodes now (ingest does it at most every `scan_every_seconds`)."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from moderation.rules import rules_current
from moderation.screening import outlier_scan
from pool.models import Rollout


class Command(BaseCommand):
    help = "Flag nodes whose mean verified reward on a dataset is an outlier (never rejects)."

    def add_arguments(self, parser) -> None:  # noqa: ANN001
        parser.add_argument("--dataset", action="append", help="Dataset name (repeatable); default: all.")

    def handle(self, *args, **options) -> None:  # noqa: ANN002, ANN003
        rule = rules_current()["outlier"]
        datasets = options["dataset"] or sorted(set(Rollout.objects.values_list("dataset", flat=True).distinct()))
        for dataset in datasets:
            flags = outlier_scan(dataset=dataset, rule=rule)
            for flag in flags:
                self.stdout.write(f"node {flag.node_id}: {flag.detail}")
        self.stdout.write(f"scanned {len(datasets)} dataset(s)")
