"""`python manage.py sapo_stats fold|rebuild|export`: fold new pool rows into the figures tables now
(pages also do it lazily every few seconds), recount everything from the pool, or write the daily
statistics export now (figures.export; the scheduled job writes it once a day)."""

from django.core.management.base import BaseCommand

from figures.export import export_dir, stats_export
from figures.stats import stats_fold, stats_rebuild


class Command(BaseCommand):
    help = (
        "Fold the pool into the leaderboard's tables (fold), recount them from scratch (rebuild), "
        "or write the statistics export now (export)."
    )

    def add_arguments(self, parser):
        parser.add_argument("action", choices=["fold", "rebuild", "export"])

    def handle(self, *args, action: str, **options):
        if action == "rebuild":
            stats_rebuild()
            self.stdout.write("rebuilt")
        elif action == "export":
            index = stats_export()
            for f in index.files:
                self.stdout.write(f"{export_dir() / f['name']}: {f['rows']} rows, {f['bytes']} bytes")
        else:
            self.stdout.write("folded" if stats_fold() else "another fold is running")
