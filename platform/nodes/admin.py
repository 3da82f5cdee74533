from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from nodes.models import Node, NodeToken
from nodes.presence import with_connected
from nodes.selectors import node_status


class NodeTokenInline(admin.TabularInline):
    model = NodeToken
    extra = 0
    can_delete = False
    fields = ("prefix", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("prefix", "created_at", "last_used_at")

    def has_add_permission(self, request, obj=None) -> bool:
        return False  # tokens are issued by services (the plaintext must be shown once)


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ("name", "owner", "status", "model_id", "client_version", "last_seen_at", "banned_at", "retired_at")
    list_filter = (("banned_at", admin.EmptyFieldListFilter), ("retired_at", admin.EmptyFieldListFilter))
    search_fields = ("name", "owner__username", "owner__display_name", "model_id")
    list_select_related = ("owner",)
    readonly_fields = ("last_seen_at", "created_at", "client_version")
    raw_id_fields = ("owner",)
    inlines = [NodeTokenInline]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Node]:
        return with_connected(super().get_queryset(request))  # a row's status then costs no query of its own

    @admin.display(description="status")
    def status(self, node: Node) -> str:
        return node_status(node)


@admin.register(NodeToken)
class NodeTokenAdmin(admin.ModelAdmin):
    list_display = ("prefix", "node", "created_at", "last_used_at", "revoked_at")
    list_select_related = ("node",)
    search_fields = ("prefix", "node__name")
    readonly_fields = ("node", "token_hash", "prefix", "created_at", "last_used_at")

    def has_add_permission(self, request) -> bool:
        return False
