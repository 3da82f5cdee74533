from django.apps import AppConfig


class WebConfig(AppConfig):
    name = "web"
    verbose_name = "Web pages and figures"

    def ready(self) -> None:
        # Moderation changes move the leaderboard's folded credit: web follows the pool's announcement.
        from accounts.events import withdrawn
        from web.export import export_withdraw
        from web.stats import follow_moderation

        follow_moderation()
        # A profile turned private or a ban leaves the published export at once (accounts.events).
        withdrawn.connect(export_withdraw, dispatch_uid="web.export.export_withdraw")
