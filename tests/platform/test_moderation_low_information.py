"""The copy rules and low-information texts: what collapsed small policies write alike on nodes that
never saw each other's (repeated tags up to the token limit) is no evidence of copying and is not held,
while a varied completion re-shared by another node, verbatim or with light edits, still is."""

from __future__ import annotations

import uuid

import pytest
from factories import make_node
from support.moderation import group, long_reasoning, share, staff

from moderation import filters
from moderation.models import ModerationFlag
from moderation.rules import RULES, Rule, default_rule, rules_forget
from moderation.services import rule_update
from pool.models import ModerationStatus

pytestmark = pytest.mark.django_db

#: What a collapsed tiny-mini policy writes up to its 48-token limit (each text is 48 tokens of its
#: tokenizer, "</answer>No" four of them): the three nodes of `make run` (local-1, local-2, silo-1)
#: wrote such texts without seeing one another's, and shared them as exact and near copies of each other.
NO = " <answer>No" + "</answer>No" * 11
YES = " <answer>Yes" + "</answer>Yes" * 11
TWELVE = " <answer>12" + "</answer>12" * 8 + "</answer>"
NO_CLOSED = " <answer>No</answer>" + "No</answer>" * 10  # 47 tokens and the end of text
NO_AFTER_A_STRAY = " <answer>No</answer>., <answer>No" + "</answer>No" * 9
NO_THEN_YES = " <answer>No" + "</answer>No" * 9 + "</answer>Yes</answer>No"
DEGENERATE = {
    "local-1": [NO, NO, NO, YES, NO, NO, TWELVE, NO],
    "local-2": [NO, NO_CLOSED, NO, NO, NO, YES, NO, NO],  # exact copies of local-1's, by coincidence
    "silo-1": [
        NO_THEN_YES,
        NO_AFTER_A_STRAY,
        NO_THEN_YES,
        NO_AFTER_A_STRAY,
        NO_THEN_YES,
        NO,
        TWELVE + "1",
        NO_AFTER_A_STRAY,
    ],
}


@pytest.fixture(autouse=True)
def _fresh_rules():
    rules_forget()
    yield
    rules_forget()


def set_rule(key: str, **params) -> None:
    rule_update(actor=staff(), key=key, enabled=True, action="hold", params={**default_rule(key).params, **params})
    rules_forget()


def holds_of(rollout) -> list[str]:
    rollout.refresh_from_db()
    if rollout.moderation_status != ModerationStatus.HELD:
        return []
    return sorted(ModerationFlag.objects.filter(rollout=rollout).values_list("rule", flat=True))


def shared_by_three_nodes(index: int) -> list:
    """Each node's degenerate texts as its group on the same question, shared one node after the other."""
    return [share(make_node(), group(index, completions=texts))[0] for texts in DEGENERATE.values()]


def test_the_real_texts_coincide_across_the_nodes():
    """The texts themselves: long enough for both rules, and their fingerprints meet across nodes
    (exactly or within the near rule's distance), so only their information tells them from copies."""
    fps = {name: filters.fingerprints([texts])[0] for name, texts in DEGENERATE.items()}
    assert all(n >= 80 for fp in fps.values() for n in fp.lengths)
    first, *others = fps.values()
    for fp in others:
        assert any(filters.hamming(a, b) <= 3 for a in fp.simhash for b in first.simhash)
    counts = filters.distinct_grams([t for fp in fps.values() for t in fp.normalised])
    assert max(counts) < default_rule("duplicate_near")["min_distinct_grams"]


def test_degenerate_texts_of_independent_nodes_are_not_held():
    rows = shared_by_three_nodes(31)
    assert [holds_of(r) for r in rows] == [[], [], []]


def test_without_the_bar_the_same_texts_are_held_as_copies():
    """The bar is what spares them: at min_distinct_grams 0 the rules hold the later nodes' groups."""
    set_rule("duplicate_exact", min_distinct_grams=0)
    set_rule("duplicate_near", min_distinct_grams=0)
    rows = shared_by_three_nodes(32)
    assert [holds_of(r) for r in rows] == [[], ["duplicate_exact"], ["duplicate_near"]]


def test_a_varied_completion_copied_verbatim_or_lightly_edited_is_still_held():
    g = group(33)
    honest = long_reasoning(g)
    share(make_node(), group(33, completions=honest))
    (verbatim,) = share(make_node(), group(33, completions=honest))
    (edited,) = share(make_node(), group(33, completions=[c.replace("carefully", "carefuly") for c in honest]))
    assert holds_of(verbatim) == ["duplicate_exact"]
    assert holds_of(edited) == ["duplicate_near"]


def test_copies_among_degenerate_texts_are_counted_among_the_informative_ones_only():
    """A group of two copied varied completions and degenerate ones: the degenerate ones neither count
    as copies nor dilute the share, so the group is held (2 of 2); a group with one varied completion of
    its own beside degenerate ones that coincide is not."""
    g = group(34)
    honest = long_reasoning(g)
    spam = DEGENERATE["local-1"][:2]
    share(make_node(), group(34, completions=honest + DEGENERATE["local-2"][:2]))
    (copier,) = share(make_node(), group(34, completions=honest[:2] + spam))
    mine = f"Multiplying out each bracket, then summing left to right, I get <answer>{g['answer']}</answer>"
    (own,) = share(make_node(), group(34, completions=[mine, *spam]))
    assert holds_of(copier) == ["duplicate_exact"]
    assert (
        ModerationFlag.objects.get(rollout=copier).detail
        == "2 of 2 completions are exact copies of other nodes' groups"
    )
    assert holds_of(own) == []


def rule(key: str, **params) -> Rule:
    base = default_rule(key)
    return Rule(key, True, base.action, {**base.params, **params})


@pytest.mark.parametrize("near", [False, True], ids=["exact", "near"])
def test_the_bar_reads_what_the_fingerprint_reads(near):
    """The exact rule counts the grams of the whole text, the near one those of the simhash's first
    SIMHASH_CHARS characters: a text repeating one tag for 4000 characters and varied after them is
    informative to the exact rule and not to the near one, whose simhash sees only the repeats."""
    tail = " ".join(f"step {k}: carry the {k * 7 % 10} and write the partial sum {k * 37}" for k in range(20))
    texts = ["</answer>no" * (filters.SIMHASH_CHARS // 11 + 1) + tail]
    (stored,) = filters.fingerprints([texts])
    source = uuid.uuid4()
    index = filters.CopyIndex(source.bytes, [1], stored.exact_bytes(), stored.simhash_packed)
    found = filters.copy_findings(
        filters.fingerprints([texts]), index, rule("duplicate_near" if near else "duplicate_exact"), near=near
    )
    assert (
        found == [None]
        if near
        else found == [("1 of 1 completions are exact copies of other nodes' groups", [str(source)])]
    )


def test_distinct_grams_counts_each_texts_distinct_four_byte_pieces():
    texts = [b"", b"abc", b"abcd", b"aaaaaaaa", b"<answer>no</answer>" + b"no</answer>" * 40, "é≈ü".encode() * 9]
    texts.append(bytes(range(256)) * 3)
    by_the_book = [len({t[i : i + 4] for i in range(len(t) - 3)}) for t in texts]
    assert filters.distinct_grams(texts) == by_the_book
    assert by_the_book[4] == 12
    assert filters.distinct_grams([]) == []


def test_the_bar_is_a_parameter_of_both_copy_rules_and_validated():
    for key in ("duplicate_exact", "duplicate_near"):
        assert RULES[key].params["min_distinct_grams"].default == 40
    with pytest.raises(Exception, match="min_distinct_grams"):
        set_rule("duplicate_near", min_distinct_grams=-1)


def test_a_completion_is_compared_with_groups_on_its_own_question_only():
    """The candidates of all a share's questions are looked up in one call, keyed by question: a
    group on one question is no copy of another node's group on another question of the same share
    (make run held tiny-mini groups on arithmetic as near copies of silo-1's on leap years)."""
    first = group(35)
    texts = long_reasoning(first)
    share(make_node(), group(35, completions=texts))
    mine = [
        f"Working the sum through from the start, step by step, I reach {k}: <answer>{k}</answer>" for k in range(4)
    ]
    elsewhere, same = share(make_node(), group(36, completions=texts), group(35, completions=mine + texts[:1]))
    assert holds_of(elsewhere) == []
    assert holds_of(same) == []
    (copied,) = share(make_node(), group(35, completions=texts))
    assert holds_of(copied) == ["duplicate_exact"]
