from django.apps import AppConfig


class FiguresConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "figures"
    verbose_name = "Figures and credit"

    def ready(self) -> None:
        # Moderation changes move the folded credit: figures follow the pool's announcement.
        from figures.stats import follow_moderation

        follow_moderation()
        # A profile turned private or a ban leaves the published export at once (accounts.events).
        from accounts.events import withdrawn
        from figures.export import export_withdraw

        withdrawn.connect(export_withdraw, dispatch_uid="figures.export.export_withdraw")
