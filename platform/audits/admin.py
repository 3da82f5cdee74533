from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from audits.jobs import audit_rerun
from audits.models import Audit, AuditBase, NodeHold
from audits.services import node_release
from common.errors import ApplicationError


@admin.register(Audit)
class AuditAdmin(admin.ModelAdmin):
    # An errored audit (its job failed every attempt) is the site's to look at: its reason names the
    # exception, the worker's log and RQ's failed-job registry hold the trace; once mended, "Run again"
    # replays it on the upload it keeps (SAPO_AUDIT_ERRORED_KEEP_SECONDS).
    list_display = (
        "id",
        "node",
        "model",
        "state",
        "attempts",
        "requested_at",
        "finished_at",
        "cpu_seconds",
        "upload_kept",
        "reason",
    )
    list_filter = ("state", "model")
    search_fields = ("id", "node__name", "weights")
    list_select_related = ("node",)
    readonly_fields = [f.name for f in Audit._meta.fields]

    actions = ["rerun"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # audits are drawn at ingest, never made by hand

    @admin.display(boolean=True, description="upload kept")
    def upload_kept(self, audit: Audit) -> bool | None:
        return bool(audit.upload_path) if audit.state == "errored" else None

    @admin.action(description="Run the selected errored audits again (on the uploads they kept)")
    def rerun(self, request: HttpRequest, queryset: QuerySet[Audit]) -> None:
        queued, refused = 0, []
        for audit_id in queryset.values_list("id", flat=True):
            try:
                audit_rerun(audit_id=audit_id, actor=request.user)
            except ApplicationError as exc:
                refused.append(f"{exc.code}: {exc.message}")
            else:
                queued += 1
        if queued:
            self.message_user(request, f"{queued} audit(s) queued again.", messages.SUCCESS)
        for line in refused:
            self.message_user(request, line, messages.WARNING)


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


@admin.register(AuditBase)
class AuditBaseAdmin(admin.ModelAdmin):
    # The bases a checkpoint may be uploaded as a difference from (recorded by the workers); deleting one
    # makes nodes send whole files for it until a worker builds it again.
    list_display = ("model", "digest", "recorded_at")
    list_filter = ("model",)
    readonly_fields = ("model", "digest", "recorded_at")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
