"""`python manage.py sapo_wheel`: build the node client's wheel now (the image's build step), print
its path and SHA-256. The site would otherwise build it on the first /download/ request."""

from django.core.management.base import BaseCommand

from web.wheel import wheel_get


class Command(BaseCommand):
    help = "Build (or find) the node client's wheel served at /download/."

    def handle(self, *args, **options):
        wheel = wheel_get()
        self.stdout.write(f"{wheel.path}\n{wheel.sha256}")
