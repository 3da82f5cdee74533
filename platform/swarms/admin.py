from django.contrib import admin

from swarms.models import Swarm, SwarmCatalogue


class SwarmCatalogueInline(admin.TabularInline):
    model = SwarmCatalogue
    extra = 0
    can_delete = False
    readonly_fields = ("version", "entries", "created_at", "created_by")

    def has_add_permission(self, request, obj=None) -> bool:  # noqa: ANN001 - Django's signature
        return False  # a new version is written by the staff page (swarms.services), audited


@admin.register(Swarm)
class SwarmAdmin(admin.ModelAdmin):
    """Read-only: every change goes through the staff page's services, which validate and audit it."""

    list_display = ("slug", "title", "state", "is_default", "catalogue_version", "created_at")
    list_filter = ("state",)
    search_fields = ("slug", "title")
    inlines = [SwarmCatalogueInline]

    def has_add_permission(self, request) -> bool:  # noqa: ANN001
        return False

    def has_change_permission(self, request, obj=None) -> bool:  # noqa: ANN001
        return False

    def has_delete_permission(self, request, obj=None) -> bool:  # noqa: ANN001
        return False
