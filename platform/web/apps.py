from django.apps import AppConfig


class WebConfig(AppConfig):
    name = "web"
    verbose_name = "Web pages and figures"

    def ready(self) -> None:
        # Moderation changes move the leaderboard's folded credit: web follows the pool's announcement.
        from web.stats import follow_moderation

        follow_moderation()
