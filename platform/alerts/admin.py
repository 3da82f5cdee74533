from django.contrib import admin

from alerts.models import Alert, AlertSettings


@admin.register(AlertSettings)
class AlertSettingsAdmin(admin.ModelAdmin):
    list_display = ("user", "email_alerts", "webhook_url", "silence_minutes", "min_acceptance", "updated_at")
    exclude = ("webhook_secret",)


@admin.register(Alert)
class AlertAdmin(admin.ModelAdmin):
    list_display = ("node", "condition", "raised_at", "raised_delivery", "cleared_at", "cleared_delivery")
    list_filter = ("condition",)
    raw_id_fields = ("user", "node")
