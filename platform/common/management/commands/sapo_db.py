from django.core.management.base import BaseCommand, CommandError

from common import embedded_db


class Command(BaseCommand):
    help = "Manage the embedded development PostgreSQL (used when DATABASE_URL is unset): status, start, stop."

    def add_arguments(self, parser) -> None:
        parser.add_argument("action", choices=["status", "start", "stop"], nargs="?", default="status")

    def handle(self, *args, action: str, **options) -> None:
        if action == "status":
            current = embedded_db.status()
            if current.running:
                self.stdout.write(
                    f"running: pid {current.pid}, {embedded_db.database_url(current.port)} (data {current.pgdata})"
                )
            else:
                self.stdout.write(f"stopped (data {current.pgdata})")
        elif action == "start":
            self.stdout.write(f"running: {embedded_db.ensure_running()}")
        elif action == "stop":
            try:
                was_running = embedded_db.stop()
            except RuntimeError as exc:
                raise CommandError(str(exc)) from exc
            self.stdout.write("stopped" if was_running else "was not running")
