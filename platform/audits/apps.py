from django.apps import AppConfig


class AuditsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "audits"
    verbose_name = "Audits"

    def ready(self) -> None:
        # The pool tells the audits of the groups it stored and asks them what a node must upload,
        # only through its seam (pool.audit_seam): plug in here.
        from audits.hooks import AUDITS
        from pool.audit_seam import audits_register

        audits_register(AUDITS)
