"""Filter forms of the moderation pages and bulk actions. An invalid field is an error, never dropped:
a filter that silently lost `since=tomorrow` would match everything, and a bulk action hit it all."""

from __future__ import annotations

from typing import Any

from django import forms

from common.errors import ApplicationError
from moderation.models import AuditAction, TargetType
from moderation.rules import RULES
from pool.models import ModerationStatus, RejectReason

ANY = ""


class InvalidFilter(ApplicationError):
    """A filter form with an invalid field (400, code "invalid_filter"); the message names each field."""

    def __init__(self, form: forms.Form) -> None:
        problems = []
        for name, errors in form.errors.items():
            field = form.fields.get(name)
            label = (field.label or name.replace("_", " ").capitalize()) if field else "Filter"
            problems.append(f"{label}: {' '.join(errors)}")
        super().__init__("invalid_filter", f"The filter is invalid: {'; '.join(problems)}")


class FilterForm(forms.Form):
    """A form of optional filters; `filters()` gives the non-empty ones as plain values."""

    def filters(self) -> dict[str, Any]:
        """Raises InvalidFilter when a field is invalid."""
        if not self.is_bound:
            return {}
        if not self.is_valid():
            raise InvalidFilter(self)
        return {k: v for k, v in self.cleaned_data.items() if v not in (None, "")}


class QueueFilterForm(FilterForm):
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
    swarm = forms.SlugField(required=False, max_length=40, label="Swarm (slug)")
    dataset = forms.CharField(required=False, max_length=64)
    node = forms.IntegerField(required=False, min_value=1, label="Node id")
    contributor = forms.CharField(required=False, max_length=150, label="Contributor (username)")
    since = forms.DateTimeField(required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))
    until = forms.DateTimeField(required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))

    FIELDS = ("status", "reason", "flag", "swarm", "dataset", "node", "contributor", "since", "until")

    def filters(self) -> dict[str, Any]:
        """As FilterForm's; with no status given (an unbound form too), held groups: the default view."""
        values = super().filters()
        if "status" not in self.data:
            values["status"] = ModerationStatus.HELD
        return values


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
