"""The near-copy rule's bars replayed on what make run's nodes shared (docs/moderation.md, "Today's make run").

    .venv/bin/python bench/near_replay.py                       # var/local-swarm/*/outbox.sqlite3
    .venv/bin/python bench/near_replay.py --top-gram-share 1.0  # the top-gram bar off

Every completion of every node's outbox that the near rule looks up (at least `min_chars` normalised
characters, `min_distinct_grams` distinct 4-grams, `min_distinct_share` of them distinct: the rule's
defaults) is compared with every other node's completion on the same question, in any order and at
any age: an upper bound on what the rule can match, since the server compares a group only with the
earlier ones in its window. Prints the completions looked up, those within `max_distance` of another
node's, and those of them the top-gram bar (`max_top_gram_share`) leaves counted, each with its
text's most frequent gram's share; and the groups the characters rule holds, with how many of them
have all rewards equal (no GRPO signal). No database: the outboxes are read-only SQLite files.
"""

from __future__ import annotations

import argparse
import collections
import json
import sqlite3
import sys
from pathlib import Path

from benchkit import ROOT, load, use_checkout

use_checkout()

from django.conf import settings  # noqa: E402

settings.configure()

from moderation import filters  # noqa: E402
from moderation.rules import default_rule  # noqa: E402


def outbox_groups(folder: Path) -> dict[str, list[dict]]:
    """Each node's shared groups (its outbox's payloads), by the node's folder name."""
    out = {}
    for path in sorted(folder.glob("*/outbox.sqlite3")):
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            out[path.parent.name] = [json.loads(p) for (p,) in db.execute("SELECT payload FROM outbox")]
    return out


def near_replay(groups: dict[str, list[dict]], top_share: float) -> None:
    """Each looked-up completion against the other nodes' on its question (the module's docstring)."""
    rule = default_rule("duplicate_near")
    by_question: dict[str, list[tuple[str, str]]] = collections.defaultdict(list)
    for node, shared in groups.items():
        for g in shared:
            by_question[g["question"]] += [(node, t) for t in g["completions"]]
    looked_up = matched = kept = 0
    for items in by_question.values():
        if len({node for node, _ in items}) < 2:
            continue
        normalised = filters.normalised_utf8([t for _, t in items])
        hashes = filters.simhashes([e.decode("utf-8") for e in normalised])
        owners = [node for node, _ in items]
        long = [i for i, e in enumerate(normalised) if len(e.decode("utf-8")) >= rule["min_chars"]]
        texts = [normalised[i].decode("utf-8")[: filters.SIMHASH_CHARS].encode("utf-8") for i in long]
        for i, distinct, top, text in zip(long, *filters.gram_profile(texts), texts, strict=True):
            windows = len(text) - 3
            if distinct < rule["min_distinct_grams"] or distinct < rule["min_distinct_share"] * windows:
                continue
            looked_up += 1
            others = (h for h, o in zip(hashes, owners, strict=True) if o != owners[i])
            if min((((hashes[i] ^ h) & (1 << 64) - 1).bit_count() for h in others), default=64) > rule["max_distance"]:
                continue
            matched += 1
            counted = top <= top_share * windows
            kept += counted
            print(f"  {owners[i]}: top gram {top / windows:.1%} {'counted' if counted else 'ignored'}: {text[:80]!r}")
    print(
        f"near rule: {looked_up} completions looked up, {matched} within distance {rule['max_distance']} of "
        f"another node's on their question, {kept} of them counted at max_top_gram_share {top_share} (load {load()})"
    )


def characters_replay(groups: dict[str, list[dict]]) -> None:
    """The characters rule (its defaults, filters.character_findings) on the same groups."""
    rule = default_rule("characters")
    held = collections.Counter()
    flat = collections.Counter()
    for node, shared in groups.items():
        findings = filters.character_findings([g["completions"] for g in shared], rule)
        for g, finding in zip(shared, findings, strict=True):
            held[node] += finding is not None
            flat[node] += finding is not None and len(set(g["rewards"])) == 1
    total = sum(len(shared) for shared in groups.values())
    print(
        f"characters rule: {sum(held.values())} of {total} groups held, by node {dict(held)}, "
        f"{sum(flat.values())} of them with all rewards equal (load {load()})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--swarm", type=Path, default=ROOT / "var" / "local-swarm", help="make run's node folders")
    parser.add_argument("--top-gram-share", type=float, default=default_rule("duplicate_near")["max_top_gram_share"])
    args = parser.parse_args()
    groups = outbox_groups(args.swarm)
    if not groups:
        print(f"no outbox under {args.swarm}", file=sys.stderr)
        return 1
    near_replay(groups, args.top_gram_share)
    characters_replay(groups)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
