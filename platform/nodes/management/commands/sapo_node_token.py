from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from accounts.models import User
from accounts.services import display_name_is_taken, user_create
from common.errors import ApplicationError
from nodes.models import Node
from nodes.services import node_create, node_token_issue


class Command(BaseCommand):
    help = (
        "Print a fresh API token for USERNAME's node NODE_NAME on the last line of the output, creating "
        "the contributor (unusable password) and the node when they do not exist. Earlier tokens stay valid."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("username")
        parser.add_argument("node_name")

    @transaction.atomic
    def handle(self, *args, username: str, node_name: str, **options) -> None:
        try:
            user = User.objects.filter(username=username).first()
            if user is None:
                display_name = username
                if display_name_is_taken(display_name):
                    display_name = f"{username}-{User.objects.count() + 1}"
                user = user_create(username=username, display_name=display_name, password=None)
                self.stderr.write(f"created contributor {username!r} (no password: set one with changepassword)")
            node = Node.objects.filter(owner=user, name=node_name, retired_at__isnull=True).first()
            if node is None:
                node = node_create(owner=user, name=node_name)
                self.stderr.write(f"created node {node.name!r} (id {node.id})")
            _, plaintext = node_token_issue(node=node)
        except ApplicationError as exc:
            raise CommandError(f"{exc.code}: {exc.message}") from exc
        self.stdout.write(plaintext)
