from __future__ import annotations

from typing import Any

from django import template

from moderation.selectors import node_trust

register = template.Library()


@register.filter
def completion_rows(rollout: Any) -> list[dict[str, Any]]:
    """(number, text, claimed reward, verified reward) for each completion of a group."""
    claimed = rollout.claimed_rewards or []
    verified = rollout.verified_rewards or []
    return [
        {
            "number": i + 1,
            "text": text,
            "claimed": claimed[i] if i < len(claimed) else None,
            "verified": verified[i] if i < len(verified) else None,
            "differs": i < len(claimed) and i < len(verified) and abs(claimed[i] - verified[i]) > 1e-6,
        }
        for i, text in enumerate(rollout.completions or [])
    ]


@register.filter
def trust(node: Any) -> float:
    return node_trust(node)


@register.filter
def decision(rollout: Any) -> Any:
    try:
        return rollout.moderation_decision
    except type(rollout).moderation_decision.RelatedObjectDoesNotExist:
        return None


@register.filter
def pretty_json(value: Any) -> str:
    """Pretty JSON for a textarea (autoescaping still applies to the result)."""
    import json

    return json.dumps(value, indent=2, sort_keys=True)
