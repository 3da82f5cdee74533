"""Teams in the admin, to find them (hidden ones included): read only. Staff rename, hide and show a
team on its page (/teams/<slug>/), where the change goes through community.services and the audit log."""

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html

from community.models import Badge, Membership, Team


class _ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    fields = ("user", "joined_at", "left_at")
    readonly_fields = fields
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


@admin.register(Team)
class TeamAdmin(_ReadOnly):
    list_display = ("name", "page", "founder", "created_at", "hidden_at", "disbanded_at")
    list_filter = (("hidden_at", admin.EmptyFieldListFilter), ("disbanded_at", admin.EmptyFieldListFilter))
    search_fields = ("name", "slug", "founder__username")
    list_select_related = ("founder",)
    inlines = [MembershipInline]

    @admin.display(description="page")
    def page(self, team: Team) -> str:
        return format_html('<a href="/teams/{}/">/teams/{}/</a>', team.slug, team.slug)


@admin.register(Badge)
class BadgeAdmin(_ReadOnly):
    list_display = ("kind", "user", "team", "awarded_at")
    list_filter = ("kind",)
    list_select_related = ("user", "team")
