from django.apps import AppConfig


class ModerationConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "moderation"
    verbose_name = "Moderation"

    def ready(self) -> None:
        # The pool calls moderation only through its seam (pool.seams): plug in here.
        from moderation.hooks import MODERATION
        from pool.seams import moderation_register

        moderation_register(MODERATION)
