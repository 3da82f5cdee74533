from django.apps import AppConfig


class LocalSwarmConfig(AppConfig):
    name = "localswarm"
    verbose_name = "Local swarm (make run)"
