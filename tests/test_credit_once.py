"""The credit rule and the recent-credit decay are written once, in platform/figures/credit.py: every
statistic composes them from there. A second definition anywhere else in platform/ (a credited-group
predicate, a group-reward sum, the decay's power of two, the decay's constants) fails here, so a new
figure (or a per-swarm one) is a filter on the shared fragments, not a copy that drifts."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLATFORM = REPO / "platform"
HOME = PLATFORM / "figures" / "credit.py"

#: What a definition looks like, in SQL or Python, whichever way it is spelled.
DEFINITIONS = {
    "credited-group predicate (SQL)": re.compile(r"moderation_status\s+NOT\s+IN", re.IGNORECASE),
    "statuses that take credit away": re.compile(
        r"""(['"]quarantined['"]|QUARANTINED)(\.value)?\W{0,40}(['"]rejected['"]|ModerationStatus\.REJECTED)"""
    ),
    "moderated-out set": re.compile(r"\bMODERATED_OUT\s*(:[^=\n]*)?=(?!=)"),
    "credited-group predicate (Python)": re.compile(r"def\s+is_credited\b"),
    "group reward (SQL)": re.compile(r"sum\(\s*x::float8\s*\)", re.IGNORECASE),
    "decay (SQL)": re.compile(r"power\(\s*2", re.IGNORECASE),
    "decay (Python)": re.compile(r"\b2(\.0)?\s*\*\*\s*\(|\bpow\(\s*2(\.0)?\s*,"),
    "decay constants": re.compile(r"\bCREDIT_(HALF_LIFE|EPOCH)\s*(:[^=\n]*)?=(?!=)"),
}


def _sources() -> list[Path]:
    return sorted(
        p
        for p in PLATFORM.rglob("*")
        if p.suffix in (".py", ".sql", ".html") and "migrations" not in p.parts and p.is_file()
    )


def _found(text: str) -> set[str]:
    return {name for name, pattern in DEFINITIONS.items() if pattern.search(text)}


def test_the_credit_rule_and_the_decay_are_defined_only_in_figures_credit():
    elsewhere = {
        str(path.relative_to(REPO)): sorted(found)
        for path in _sources()
        if path != HOME and (found := _found(path.read_text(encoding="utf-8")))
    }
    assert elsewhere == {}


def test_the_scan_sees_each_definition_where_it_lives_and_in_a_copy():
    # Every pattern matches the one definition, so none of them can silently match nothing.
    assert _found(HOME.read_text(encoding="utf-8")) == set(DEFINITIONS)
    # The copies the rule was written in before it had one home are each caught.
    copies = [
        "SELECT r.verdict = 'accepted' AND r.moderation_status NOT IN ('quarantined', 'rejected') AS credited",
        "sum(c.reward * power(2.0::float8, extract(epoch FROM r.created_at - %(epoch)s)::float8 / %(half_life)s))",
        "growth = reward * 2.0 ** ((r.created_at - CREDIT_EPOCH).total_seconds() / half_life)",
        "CREDIT_HALF_LIFE = timedelta(days=7)",
        'MODERATED_OUT = ("quarantined", "rejected")',
        "(SELECT coalesce(sum(x::float8), 0) FROM jsonb_array_elements_text(r.verified_rewards) AS x)",
        "out = (ModerationStatus.QUARANTINED, ModerationStatus.REJECTED)",
    ]
    for copy in copies:
        assert _found(copy), copy
    # Reading the constants, or a power of two that is no decay, is no definition.
    assert not _found("credit.CREDIT_HALF_LIFE.days; MAX = 2**62; if CREDIT_EPOCH == now: pass")
