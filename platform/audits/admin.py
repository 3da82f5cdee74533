from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from audits.models import Audit, NodeHold
from audits.services import node_release


@admin.register(Audit)
class AuditAdmin(admin.ModelAdmin):
    # An errored audit (its job failed every attempt) is the site's to look at: its reason names the
    # exception, the worker's log and RQ's failed-job registry hold the trace.
    list_display = ("id", "node", "model", "state", "attempts", "requested_at", "finished_at", "cpu_seconds", "reason")
    list_filter = ("state", "model")
    search_fields = ("id", "node__name", "weights")
    list_select_related = ("node",)
    readonly_fields = [f.name for f in Audit._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # audits are drawn at ingest, never made by hand


@admin.register(NodeHold)
class NodeHoldAdmin(admin.ModelAdmin):
    list_display = ("node", "held_at", "released_at", "released_by", "reason")
    list_filter = (("released_at", admin.EmptyFieldListFilter),)
    list_select_related = ("node", "released_by")
    readonly_fields = ("node", "audit", "reason", "held_at", "released_at", "released_by")
    actions = ["release"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.action(description="Release the selected nodes (their next groups are pending again)")
    def release(self, request: HttpRequest, queryset: QuerySet[NodeHold]) -> None:
        released = sum(node_release(actor=request.user, node_id=h.node_id) for h in queryset)
        self.message_user(request, f"{released} node(s) released.", messages.SUCCESS)
