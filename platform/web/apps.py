from django.apps import AppConfig


class WebConfig(AppConfig):
    name = "web"
    verbose_name = "Web pages"

    def ready(self) -> None:
        # A profile turned private or a ban leaves the published export at once (accounts.events).
        from accounts.events import withdrawn
        from web.export import export_withdraw

        withdrawn.connect(export_withdraw, dispatch_uid="web.export.export_withdraw")
