"""`python manage.py sapo_stats fold|rebuild`: fold new pool rows into the figures tables now (pages
also do it lazily every few seconds), or recount everything from the pool."""

from django.core.management.base import BaseCommand

from web.stats import stats_fold, stats_rebuild


class Command(BaseCommand):
    help = "Fold the pool into the leaderboard's tables (fold), or recount them from scratch (rebuild)."

    def add_arguments(self, parser):
        parser.add_argument("action", choices=["fold", "rebuild"])

    def handle(self, *args, action: str, **options):
        if action == "rebuild":
            stats_rebuild()
            self.stdout.write("rebuilt")
        else:
            self.stdout.write("folded" if stats_fold() else "another fold is running")
