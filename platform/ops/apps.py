from django.apps import AppConfig


class OpsConfig(AppConfig):
    """Operations: health and readiness probes, Prometheus metrics, the Content-Security-Policy
    header, and checks on how the site is deployed (docs/deploy.md)."""

    name = "ops"

    def ready(self) -> None:
        from ops import checks  # noqa: F401  (registers the system checks)
