from django.apps import AppConfig


class SocketsConfig(AppConfig):
    name = "sockets"
    verbose_name = "Node sockets"

    def ready(self) -> None:
        # A staff change of a swarm reaches the swarm's open sockets (sockets.swarm_places).
        from sockets.swarm_places import swarm_changed_broadcast
        from swarms.signals import swarm_changed

        swarm_changed.connect(swarm_changed_broadcast, dispatch_uid="sockets.swarm_changed_broadcast")
