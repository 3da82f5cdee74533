from django.apps import AppConfig


class SwarmsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "swarms"
    verbose_name = "Swarms: training campaigns and their catalogues"
