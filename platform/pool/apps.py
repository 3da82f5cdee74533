from django.apps import AppConfig


class PoolConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "pool"
    verbose_name = "Rollout pool"

    def ready(self) -> None:
        # A staff change of a swarm reaches the swarm's open sockets (pool.swarm_places).
        from pool.swarm_places import swarm_changed_broadcast
        from swarms.signals import swarm_changed

        swarm_changed.connect(swarm_changed_broadcast, dispatch_uid="pool.swarm_changed_broadcast")
