"""The automatic rules' definitions and their current settings (switchable, tunable, briefly cached).

Each rule is a row of `ModerationRule` (key, enabled, action, params; a swarm's own rule also names
its swarm and applies to its shares besides the site's). Staff edit them on
/moderation/rules/ or in the admin; `rules_current()` reads them at most every CACHE_SECONDS per
process, so a change applies everywhere within that time, without a deploy. The copy is kept as the
Rule objects themselves, in the process (not in Django's cache: the local-memory cache pickles every
value it returns, and ingest asks for the rules on every share; docs/benchmarks.md, "Pool"). A missing row means the
defaults below. `verification` is the pool's own verdict: always on, listed for the audit log.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from moderation.safe_regex import BlocklistError, validate_patterns

CACHE_SECONDS = 10

#: The copy rules ignore a completion with fewer distinct byte 4-grams than this
#: (moderation.filters.copy_findings): a degenerate text such as `<answer>no</answer>no</answer>...`
#: up to a token limit holds 12, and independent nodes write it alike.
MIN_DISTINCT_GRAMS = 40
MIN_DISTINCT_GRAMS_HELP = "Completions with fewer distinct 4-character pieces (once repeats collapse) are ignored."


@dataclass(frozen=True)
class Param:
    kind: type  # int, float, bool or list (of strings)
    default: Any
    low: float | None = None
    high: float | None = None
    help: str = ""


@dataclass(frozen=True)
class RuleSpec:
    key: str
    title: str
    help: str
    params: dict[str, Param] = field(default_factory=dict)
    enabled: bool = True
    action: str = "hold"
    switchable: bool = True
    has_action: bool = True
    #: A swarm may have a rule of this key of its own (ModerationRule.swarm), applied to its shares
    #: besides the site's: the rules that judge a group by its own text or its node's trust.
    per_swarm: bool = False


RULES: dict[str, RuleSpec] = {
    spec.key: spec
    for spec in [
        RuleSpec(
            "verification",
            "Verification mismatch",
            "The pool's verdict: the server re-scores every group; a mismatch rejects it. Always on.",
            switchable=False,
            has_action=False,
        ),
        RuleSpec(
            "duplicate_exact",
            "Exact copy across nodes",
            "Completions whose normalised text equals a completion of another node's recent group on the same question.",
            {
                "min_chars": Param(int, 40, 1, 100_000, "Completions shorter than this (normalised) are ignored."),
                "min_distinct_grams": Param(int, MIN_DISTINCT_GRAMS, 0, 100_000, MIN_DISTINCT_GRAMS_HELP),
                "min_share": Param(float, 0.5, 0.01, 1.0, "Share of a group's long completions that must match."),
                "window_hours": Param(int, 72, 1, 24 * 90, "How far back to look."),
                "max_candidates": Param(int, 50, 1, 1000, "Most recent other groups compared per question."),
            },
        ),
        RuleSpec(
            "duplicate_near",
            "Near copy across nodes",
            "Like the exact rule, but on 64-bit simhashes of character 4-grams within a Hamming distance.",
            {
                "min_chars": Param(int, 80, 1, 100_000, "Completions shorter than this (normalised) are ignored."),
                "min_distinct_grams": Param(int, MIN_DISTINCT_GRAMS, 0, 100_000, MIN_DISTINCT_GRAMS_HELP),
                "min_distinct_share": Param(
                    float,
                    0.5,
                    0.0,
                    1.0,
                    "Completions whose 4-character pieces are mostly repeats (distinct ones below this share) are "
                    "ignored: their simhash is their repeats'.",
                ),
                "max_top_gram_share": Param(
                    float,
                    0.1,
                    0.0,
                    1.0,
                    "Completions whose most frequent 4-character piece is more than this share of their pieces are "
                    "ignored: that one piece outweighs the rest of their simhash.",
                ),
                "min_share": Param(float, 0.5, 0.01, 1.0, "Share of a group's long completions that must match."),
                "max_distance": Param(int, 3, 0, 3, "Largest Hamming distance between simhashes (at most 3)."),
                "window_hours": Param(int, 72, 1, 24 * 90, "How far back to look."),
                "max_candidates": Param(int, 50, 1, 1000, "Most recent other groups compared per question."),
            },
        ),
        RuleSpec(
            "length",
            "Completion length",
            "Completions longer than the limit.",
            {"max_chars": Param(int, 6000, 1, 1_000_000, "Longest completion allowed.")},
            per_swarm=True,
        ),
        RuleSpec(
            "characters",
            "Character classes",
            "Completions made largely of non-printable (control, zero-width, bidi), non-ASCII or repeated characters.",
            {
                "max_nonprintable_share": Param(float, 0.01, 0.0, 1.0, "Control characters other than newline/tab."),
                "max_non_ascii_share": Param(float, 0.5, 0.0, 1.0, "Characters outside ASCII."),
                "max_repeat_share": Param(float, 0.6, 0.0, 1.0, "Characters equal to the one before them."),
                "min_chars_for_shares": Param(int, 20, 0, 100_000, "Shares apply to completions this long or longer."),
            },
            per_swarm=True,
        ),
        RuleSpec(
            "blocklist",
            "Regex blocklist",
            "Completions, question or answer matching a blocklisted pattern (a safe regex subset, see docs).",
            {
                "patterns": Param(list, [], None, None, "One pattern per line; case-insensitive."),
            },
            enabled=False,
            per_swarm=True,
        ),
        RuleSpec(
            "outlier",
            "Outlier node",
            "A node whose mean verified reward on a dataset is far from other nodes' (z-score): flagged for review, "
            "never rejected.",
            {
                "z_threshold": Param(float, 3.0, 0.5, 100.0, "Flag when |z| is at least this."),
                "min_groups": Param(int, 20, 2, 100_000, "Groups a node needs on a dataset to be judged or compared."),
                "min_nodes": Param(int, 3, 2, 10_000, "Other qualifying nodes needed on the dataset."),
                "sd_floor": Param(float, 0.05, 0.0001, 1.0, "Smallest spread used (avoids huge z on tiny spreads)."),
                "window_hours": Param(int, 168, 1, 24 * 90, "Groups from this recent period are compared."),
                "max_groups": Param(int, 20000, 100, 1_000_000, "Most recent groups of a dataset read per scan."),
                "scan_every_seconds": Param(int, 600, 10, 86_400, "Ingest re-scans a dataset at most this often."),
            },
            action="flag",
            has_action=False,
        ),
        RuleSpec(
            "low_trust",
            "Low trust",
            "Groups of a node whose trust is below the threshold.",
            {"threshold": Param(float, 0.15, 0.0, 1.0, "Trust below this triggers the rule.")},
            enabled=False,
            per_swarm=True,
        ),
        RuleSpec(
            "trust",
            "Trust formula, quota and sampling",
            "trust = (streak + 1) / (streak + 1 + half_streak). Enabled: low trust lowers the message quota.",
            {
                "half_streak": Param(int, 9, 1, 100_000, "Accepted groups in a row (plus one) giving trust 0.5."),
                "quota_floor": Param(float, 0.25, 0.01, 1.0, "Quota share at trust 0: quota = base*(f + (1-f)*trust)."),
                "sample_weighting": Param(bool, False, help="Weight sampling by trust (rejection sampling)."),
                "sample_floor": Param(float, 0.1, 0.01, 1.0, "Acceptance at trust 0: p = f + (1-f)*trust."),
            },
            has_action=False,
        ),
    ]
}


@dataclass(frozen=True)
class Rule:
    key: str
    enabled: bool
    action: str
    params: dict[str, Any]

    @property
    def holds(self) -> bool:
        return self.enabled and self.action == "hold"

    def __getitem__(self, name: str) -> Any:
        return self.params[name]


class RuleError(ValueError):
    pass


def default_rule(key: str) -> Rule:
    spec = RULES[key]
    return Rule(key, spec.enabled, spec.action, {name: p.default for name, p in spec.params.items()})


def clean_params(key: str, raw: dict[str, Any]) -> dict[str, Any]:
    """Validate a rule's params: known names, right types, inside bounds; missing ones get defaults.

    Raises RuleError with a message naming the parameter.
    """
    spec = RULES[key]
    unknown = set(raw) - set(spec.params)
    if unknown:
        raise RuleError(f"unknown parameter(s): {', '.join(sorted(unknown))}")
    cleaned: dict[str, Any] = {}
    for name, param in spec.params.items():
        value = raw.get(name, param.default)
        if param.kind is bool:
            if not isinstance(value, bool):
                raise RuleError(f"{name}: expected true or false")
        elif param.kind is list:
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise RuleError(f"{name}: expected a list of strings")
            if key == "blocklist":
                try:
                    value = validate_patterns(value)
                except BlocklistError as exc:
                    raise RuleError(f"{name}: {exc}") from exc
        else:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise RuleError(f"{name}: expected a number")
            if param.kind is int:
                if value != int(value):
                    raise RuleError(f"{name}: expected a whole number")
                value = int(value)
            else:
                value = float(value)
            if (param.low is not None and value < param.low) or (param.high is not None and value > param.high):
                raise RuleError(f"{name}: must be between {param.low:g} and {param.high:g}")
        cleaned[name] = value
    return cleaned


#: The keys a swarm may have rules of its own for.
PER_SWARM_KEYS = tuple(key for key, spec in RULES.items() if spec.per_swarm)


def rule_of_row(row: Any, fallback: Rule) -> Rule:
    spec = RULES[row.key]
    try:
        params = clean_params(row.key, row.params or {})
    except RuleError:
        params = fallback.params  # a hand-edited bad row falls back to defaults
    return Rule(
        row.key,
        row.enabled if spec.switchable else True,
        row.action if spec.has_action and row.action in ("flag", "hold") else spec.action,
        params,
    )


@dataclass(frozen=True)
class _Rules:
    site: dict[str, Rule]
    #: swarm id -> its own enabled rules by key (per-swarm keys only; a swarm without any is absent).
    swarms: dict[int, dict[str, Rule]]


def _load() -> _Rules:
    from moderation.models import ModerationRule

    rules = {key: default_rule(key) for key in RULES}
    swarms: dict[int, dict[str, Rule]] = {}
    for row in ModerationRule.objects.filter(key__in=list(RULES)):
        if row.swarm_id is None:
            rules[row.key] = rule_of_row(row, rules[row.key])
        elif row.key in PER_SWARM_KEYS and row.enabled:
            swarms.setdefault(row.swarm_id, {})[row.key] = rule_of_row(row, default_rule(row.key))
    return _Rules(rules, swarms)


#: (monotonic time it expires, the rules): this process's copy. Rules are frozen; callers only read them.
_current: tuple[float, _Rules] | None = None


def _rules(use_cache: bool) -> _Rules:
    global _current
    now = time.monotonic()
    if use_cache and _current is not None and now < _current[0]:
        return _current[1]
    rules = _load()
    _current = (now + CACHE_SECONDS, rules)
    return rules


def rules_current(*, use_cache: bool = True) -> dict[str, Rule]:
    """The site's rules in force, keyed by rule key (this process's copy, at most CACHE_SECONDS old).

    The dict is shared by every caller until it expires: read it, never change it."""
    return _rules(use_cache).site


def swarm_rules_current(swarm_id: int, *, use_cache: bool = True) -> dict[str, Rule]:
    """The enabled rules of a swarm of its own, by key (empty: none), applied to its shares besides the
    site's; read from the same copy as `rules_current`. Read it, never change it."""
    return _rules(use_cache).swarms.get(swarm_id, {})


def rules_forget() -> None:
    """Drop this process's copy (after a change; other processes catch up within CACHE_SECONDS)."""
    global _current
    _current = None
