from django.apps import AppConfig


class FiguresConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "figures"
    verbose_name = "Figures and credit"

    def ready(self) -> None:
        # Moderation changes move the folded credit: figures follow the pool's announcement.
        from figures.stats import follow_moderation

        follow_moderation()
