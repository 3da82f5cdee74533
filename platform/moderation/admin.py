from django import forms
from django.contrib import admin
from django.http import HttpRequest

from common.json_input import BoundedJSONFormField
from moderation.models import (
    AuditEntry,
    ModerationDecision,
    ModerationFlag,
    ModerationRule,
    RolloutFingerprint,
    TrustRecord,
)
from moderation.rules import RULES, RuleError, clean_params
from swarms.scope import SITE, Scope


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:  # noqa: ANN001
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:  # noqa: ANN001
        return False


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    """Append-only: no add, change or delete here (and the database refuses UPDATE/DELETE anyway)."""

    list_display = ("created_at", "actor", "rule", "action", "target_type", "target_id", "count", "reason")
    list_filter = ("action", "target_type", "rule")
    search_fields = ("target_id", "reason", "actor__username")
    list_select_related = ("actor",)
    date_hierarchy = "created_at"
    show_full_result_count = False

    def get_actions(self, request: HttpRequest) -> dict:
        return {}  # no "delete selected"


class ModerationRuleForm(forms.ModelForm):
    params = BoundedJSONFormField(required=False)

    class Meta:
        model = ModerationRule
        fields = ("key", "swarm", "enabled", "action", "params")

    def clean(self) -> dict:
        data = super().clean()
        key = data.get("key") or self.instance.key
        if key not in RULES:
            raise forms.ValidationError(f"Unknown rule {key!r}; one of {', '.join(RULES)}.")
        swarm = data.get("swarm") if "swarm" in data else self.instance.swarm
        if swarm is not None and not RULES[key].per_swarm:
            self.add_error("swarm", f"The rule {key!r} is the site's only; a swarm cannot have its own.")
        try:
            data["params"] = clean_params(key, data.get("params") or {})
        except RuleError as exc:
            self.add_error("params", str(exc))
        return data


@admin.register(ModerationRule)
class ModerationRuleAdmin(admin.ModelAdmin):
    """Edits go through moderation.services.rule_update: validated and audited like the staff page's.
    A rule with no swarm is the site's; with one, that swarm's own (applied besides the site's)."""

    form = ModerationRuleForm
    list_display = ("key", "swarm", "enabled", "action", "updated_at", "updated_by")
    list_filter = ("swarm",)
    readonly_fields = ("updated_at", "updated_by")

    def get_readonly_fields(self, request: HttpRequest, obj=None) -> tuple:  # noqa: ANN001
        return (*self.readonly_fields, "key", "swarm") if obj else self.readonly_fields

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:  # noqa: ANN001
        return False

    def save_model(self, request, obj, form, change) -> None:  # noqa: ANN001
        from moderation.services import rule_update

        row = rule_update(
            actor=request.user,
            key=obj.key,
            enabled=obj.enabled,
            action=obj.action,
            params=obj.params or {},
            scope=SITE if obj.swarm_id is None else Scope.swarm(obj.swarm_id),
        )
        obj.pk = row.pk
        obj.refresh_from_db()


@admin.register(ModerationDecision)
class ModerationDecisionAdmin(ReadOnlyAdmin):
    list_display = ("rollout", "status", "rule", "actor", "decided_at", "reason")
    list_filter = ("status", "rule")
    list_select_related = ("actor",)
    search_fields = ("rollout__id", "reason")


@admin.register(ModerationFlag)
class ModerationFlagAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "rule", "node", "rollout", "detail", "resolved_at")
    list_filter = ("rule", ("resolved_at", admin.EmptyFieldListFilter))
    list_select_related = ("node",)


@admin.register(RolloutFingerprint)
class RolloutFingerprintAdmin(ReadOnlyAdmin):
    list_display = ("rollout", "node", "question_hash", "created_at")


@admin.register(TrustRecord)
class TrustRecordAdmin(ReadOnlyAdmin):
    list_display = ("node", "streak", "accepted", "rejected", "last_rejected_at", "updated_at")
    list_select_related = ("node",)
