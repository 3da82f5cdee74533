"""Shared helpers for the moderation tests (no tests here): real groups shared through the pool."""

from __future__ import annotations

import uuid
from typing import Any

from accounts.models import User
from moderation.rules import default_rule, rules_forget
from moderation.services import rule_update
from nodes.models import Node
from pool.ingest import rollout_share
from pool.models import Rollout
from support.pool import SAPO, default_swarm, make_group, to_rollout_in
from swarms.scope import SITE, Scope


def share(node: Node, *groups: dict[str, Any]) -> list[Rollout]:
    """Share groups as `node` through the pool (verification, automatic rules, storage); the stored rows."""
    rollout_share(node=node, rollouts=[to_rollout_in(g) for g in groups], catalogue=SAPO, swarm=default_swarm())
    rows = {r.id: r for r in Rollout.objects.with_texts().filter(id__in=[g["id"] for g in groups])}
    return [rows[uuid.UUID(g["id"])] for g in groups]


def group(index: int = 7, *, completions: list[str] | None = None, **kwargs: Any) -> dict[str, Any]:
    """A verified-correct group of basic_arithmetic #index; `completions` replaces the texts (rescored)."""
    g = make_group(index=index, **kwargs)
    if completions is not None:
        from sapo_node.tasks import build_entry, score_completion

        spec = SAPO.get(g["task"]["dataset"])
        entry = build_entry(spec, g["task"]["seed"], g["task"]["index"])
        g["completions"] = completions
        g["rewards"] = [score_completion(spec, g["task"]["seed"], entry, c) for c in completions]
    return g


def answer_of(g: dict[str, Any]) -> str:
    return g["answer"]


def long_reasoning(g: dict[str, Any], variant: str = "") -> list[str]:
    """Two right and two wrong completions long enough for the copy rules."""
    body = (
        "First I add the first two terms carefully, then I apply the remaining operations in order, "
        "checking each intermediate value twice before moving on to the next step of the sum"
    )
    return [
        f"{body}{variant}. <answer>{g['answer']}</answer>",
        f"{body}{variant}; so the result is <answer>{g['answer']}</answer>",
        f"{body}{variant}, hence <answer>wrong one</answer>",
        f"{body}{variant}, hence <answer>wrong two</answer>",
    ]


def staff(username: str | None = None) -> User:
    """A staff user (a moderator); a fresh one each call unless `username` names an existing one."""
    from factories import make_user

    if username and User.objects.filter(username=username).exists():
        return User.objects.get(username=username)
    return make_user(username=username, is_staff=True)


def set_rule(key: str, *, scope: Scope = SITE, enabled: bool = True, action: str = "hold", **params: Any) -> None:
    """Set one automatic rule as staff do (the site's, or `scope`'s own), its parameters over the rule's
    defaults, and forget this process's copy of the rules so the next share reads it."""
    rule_update(
        actor=staff(),
        key=key,
        enabled=enabled,
        action=action,
        params={**default_rule(key).params, **params},
        scope=scope,
    )
    rules_forget()


def hamming(a: int, b: int) -> int:
    """Bits apart of two simhashes (signed 64-bit, as moderation.kernels gives them): the distance the
    near-copy rule bounds, which the product computes in moderation.kernels."""
    return ((a ^ b) & ((1 << 64) - 1)).bit_count()
