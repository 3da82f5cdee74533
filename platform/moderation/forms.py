"""Filter forms of the moderation pages (GET parameters; invalid values are ignored, not errors)."""

from __future__ import annotations

from typing import Any

from django import forms

from moderation.models import AuditAction, TargetType
from moderation.rules import RULES
from pool.models import ModerationStatus, RejectReason

ANY = ""


class QueueFilterForm(forms.Form):
    status = forms.ChoiceField(
        required=False,
        initial=ModerationStatus.HELD,
        choices=[("any", "Any status"), *ModerationStatus.choices],
    )
    reason = forms.ChoiceField(
        required=False,
        label="Verdict",
        choices=[(ANY, "Any verdict"), ("accepted", "Accepted"), *RejectReason.choices],
    )
    flag = forms.ChoiceField(
        required=False,
        label="Auto-filter flag",
        choices=[(ANY, "Flagged or not"), ("any", "Any flag"), ("none", "No flag")]
        + [(key, spec.title) for key, spec in RULES.items() if key not in ("verification", "trust", "outlier")],
    )
    dataset = forms.CharField(required=False, max_length=64)
    node = forms.IntegerField(required=False, min_value=1, label="Node id")
    contributor = forms.CharField(required=False, max_length=150, label="Contributor (username)")
    since = forms.DateTimeField(required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))
    until = forms.DateTimeField(required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))

    FIELDS = ("status", "reason", "flag", "dataset", "node", "contributor", "since", "until")

    def filters(self) -> dict[str, Any]:
        """The valid filters as plain values (an unbound form: the default view, held groups)."""
        if not self.is_bound:
            return {"status": ModerationStatus.HELD}
        self.is_valid()
        data = getattr(self, "cleaned_data", {})
        values = {name: data.get(name) for name in self.FIELDS if data.get(name) not in (None, "")}
        if "status" not in self.data:
            values["status"] = ModerationStatus.HELD
        return values


class FilterForm(forms.Form):
    """A GET form of optional filters; `filters()` gives the valid, non-empty ones as plain values."""

    def filters(self) -> dict[str, Any]:
        if not self.is_bound:
            return {}
        self.is_valid()
        data = getattr(self, "cleaned_data", {})
        return {k: v for k, v in data.items() if v not in (None, "")}


class AuditFilterForm(FilterForm):
    action = forms.ChoiceField(required=False, choices=[(ANY, "Any action"), *AuditAction.choices])
    actor = forms.CharField(required=False, max_length=150, label="Moderator (username)")
    rule = forms.ChoiceField(required=False, choices=[(ANY, "Any rule"), *((k, s.title) for k, s in RULES.items())])
    target_type = forms.ChoiceField(required=False, choices=[(ANY, "Any target"), *TargetType.choices])
    target_id = forms.CharField(required=False, max_length=64)
    since = forms.DateTimeField(required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))
    until = forms.DateTimeField(required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))


class NodeFilterForm(FilterForm):
    q = forms.CharField(required=False, max_length=150, label="Node or contributor")
    state = forms.ChoiceField(
        required=False,
        choices=[(ANY, "All nodes"), ("flagged", "Flagged"), ("banned", "Banned"), ("low_trust", "Lowest trust first")],
    )
