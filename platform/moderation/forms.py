"""Filter forms of the moderation pages and bulk actions. An invalid field is an error, never dropped:
a filter that silently lost `since=tomorrow` would match everything, and a bulk action hit it all."""

from __future__ import annotations

from typing import Any

from django import forms

from common.errors import ApplicationError
from moderation.models import AuditAction, TargetType
from moderation.rules import RULES, Param, RuleSpec
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


def _figure(value: float | None) -> str:
    """A bound as a person reads it: 1,000,000 and 0.01, not 1e+06."""
    return f"{int(value):,}" if value is not None and value == int(value) else f"{value:g}"


class RuleForm(forms.Form):
    """One automatic rule's settings as the staff page edits them: a field per parameter of its kind
    (a whole number, a share, a switch, a list of patterns a line), with the parameter's bounds and help
    from moderation.rules, plus the rule's switch and action where it has them. Field names carry the
    rule's key as their prefix, so every rule's form on the page has its own ids. Parameter values the
    form cannot see (a pattern's safety) are checked by services.rule_update, as for the JSON a script
    posts instead."""

    ACTIONS = [("hold", "Hold for review"), ("flag", "Flag only")]

    def __init__(self, spec: RuleSpec, rule: Any = None, data: Any = None) -> None:
        initial: dict[str, Any] = {}
        if rule is not None:
            initial = {"enabled": rule.enabled, "action": rule.action}
            for name, param in spec.params.items():
                value = rule.params.get(name, param.default)
                initial[name] = "\n".join(value) if param.kind is list else value
        super().__init__(data=data, initial=initial, prefix=spec.key)
        self.spec = spec
        if spec.switchable:
            self.fields["enabled"] = forms.BooleanField(required=False, label="Enabled")
        if spec.has_action:
            self.fields["action"] = forms.ChoiceField(
                choices=self.ACTIONS,
                help_text="Hold: the group leaves the pool until a moderator decides. Flag: it stays, marked.",
            )
        for name, param in spec.params.items():
            self.fields[name] = self._field(name, param)

    @staticmethod
    def _field(name: str, param: Param) -> forms.Field:
        label = name.replace("_", " ").capitalize()
        if param.kind is bool:
            return forms.BooleanField(required=False, label=label, help_text=param.help)
        if param.kind is list:
            return forms.CharField(
                required=False,
                label=label,
                help_text=param.help,
                max_length=100_000,
                widget=forms.Textarea(attrs={"rows": 4, "spellcheck": "false", "class": "mono"}),
            )
        bounds = f" From {_figure(param.low)} to {_figure(param.high)}." if param.high is not None else ""
        if param.kind is int:
            return forms.IntegerField(
                label=label, help_text=param.help + bounds, min_value=param.low, max_value=param.high
            )
        return forms.FloatField(
            label=label,
            help_text=param.help + bounds,
            min_value=param.low,
            max_value=param.high,
            widget=forms.NumberInput(attrs={"step": "any"}),
        )

    def params(self) -> dict[str, Any]:
        """The parameters as services.rule_update takes them (call after is_valid())."""
        values = {}
        for name, param in self.spec.params.items():
            value = self.cleaned_data[name]
            if param.kind is list:
                value = [line.strip() for line in value.splitlines() if line.strip()]
            values[name] = value
        return values

    def problems(self) -> str:
        """The invalid fields in one sentence, each by its label."""
        return "; ".join(
            f"{self.fields[name].label if name in self.fields else 'Form'}: {' '.join(errors)}"
            for name, errors in self.errors.items()
        )
