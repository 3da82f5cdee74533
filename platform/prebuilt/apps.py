from django.apps import AppConfig


class PrebuiltConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "prebuilt"
    verbose_name = "Prebuilt models"
