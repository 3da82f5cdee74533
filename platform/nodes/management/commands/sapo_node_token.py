from django.core.management.base import BaseCommand, CommandError

from common.errors import ApplicationError
from nodes.services import node_provision


class Command(BaseCommand):
    help = (
        "Print a fresh API token for USERNAME's node NODE_NAME on the last line of the output, creating "
        "the contributor (unusable password) and the node when they do not exist. Earlier tokens stay valid."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("username")
        parser.add_argument("node_name")

    def handle(self, *args, username: str, node_name: str, **options) -> None:
        try:
            node, plaintext = node_provision(username=username, node_name=node_name)
        except ApplicationError as exc:
            raise CommandError(f"{exc.code}: {exc.message}") from exc
        self.stderr.write(f"node {node.name!r} (id {node.id}) of contributor {username!r}")
        self.stdout.write(plaintext)
