from django.apps import AppConfig


class ModerationConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "moderation"
    verbose_name = "Moderation"

    def ready(self) -> None:
        # The pool calls moderation only through its seam (pool.seams): plug in here.
        from moderation.hooks import MODERATION, SWARM_OVERSIGHT
        from pool.seams import moderation_register
        from swarms.seams import oversight_register

        moderation_register(MODERATION)
        oversight_register(SWARM_OVERSIGHT)
