"""The copy rules and low-information texts: what collapsed small policies write alike on nodes that
never saw each other's (repeated tags up to the token limit) is no evidence of copying and is not held,
while a varied completion re-shared by another node, verbatim or with light edits, still is."""

from __future__ import annotations

import uuid
from collections import Counter

import pytest
from factories import make_node
from support.moderation import group, hamming, long_reasoning, set_rule, share

from moderation import filters
from moderation.models import ModerationFlag
from moderation.rules import RULES, Rule, default_rule, rules_forget
from pool.models import ModerationStatus

pytestmark = pytest.mark.django_db

#: Completions of make run's tiny-mini nodes once their policies had collapsed (from the pool's texts
#: of a 15-minute run): local-1 wrote `</answer>No` up to its 48-token limit, silo-1 shorter runs of
#: it, each without seeing the other's. local-1's later group is one the copy rules held as a near copy
#: of silo-1's, and one text of silo-1's equals one of local-1's earlier group.
LOCAL_1_EARLIER = [
    " <answer>No</answer>No</answer>No</answer>",
    " <answer>1</answer>No</answer>No</answer>",
    " <answer>No</answer>No</answer>No</answer>",
    " <answer>8</answer>No</answer>No</answer>No</answer>",
    " <answer>No</answer>No</answer>No</answer>",
    " <answer>No</answer>No</answer>No</answer>",
    " <answer>Yes</answer>No</answer>No</answer>",
    " <answer>No</answer>No</answer>No</answer>",
]
SILO_1 = [
    " <answer>No</answer>",
    " <answer>No</answer>",
    " <answer>No</answer>No</answer>",
    " <answer> above</answer>",
    " <answer>No</answer>",
    " <answer>No</answer>No</answer>No</answer>",
    " <answer>No</answer>",
    " <answer>No</answer>No</answer>",
]
LOCAL_1_LATER = [
    " <answer>11</answer>No</answer>No</answer>No</answer>No</answer>2</answer>No</answer>No</answer>No</answer>No</answer>No</answer>",
    " <answer>-11</answer>No</answer>No</answer>No</answer>No</answer>No</answer>No</answer>No</answer>No</answer>No</answer>No</answer>",
    " <answer>16</answer>No</answer>No</answer>No</answer>No</answer>No</answer>No</answer>No</answer>No</answer>No</answer>No</answer>",
    " <answer>11</answer>No</answer>No</answer>No</answer> with fraction computer/1</answer>No</answer>No</answer>No</answer>No</answer>?/No</",
    " <answer>-11</answer>No</answer>No</answer>No</answer>No</answer>No</answer>No</answer>No</answer>No</answer>No</answer> Yesk/1",
    " <answer ></answer>No</answer>No</answer>No</answer>No</answer>No</answer>No</answer>No</answer>No</answer>No</answer>No</answer>No</",
    " <answer>1</answer>No</answer>No</answer>-No</answer>No</answer>No</answer>No</answer>No</answer>No</answer>No</answer>No</answer>No",
    " <answer>11</answer>No</answer>No</answer>No</answer>No</answer>No</answer>No</answer>No</answer>No</answer>No</answer>No</answer>",
]


#: A group of local-2 and a later one of local-1 on one question (make run's 'Simplify the fraction 6/9',
#: from the nodes' outboxes): local-1's long text is varied junk (78% of its grams distinct) in which
#: `++++` occurs 38 times in 238 grams, enough to outvote the rest of its simhash, which lies within
#: distance 1 of local-2's short `++++++++++++++.`. make run held local-1's group as a near copy.
LOCAL_2_PLUSES = [
    " <answer>++++++++++++++.",
    " <answer>1/1</answer>-",
    " <answer>1/1</answer>",
    " <answer>5/1</answer>",
    " <answer>1/1</answer>",
    " <answer>1/4</answer>",
    " <answer>1/1</answer>",
    " <answer>1/1</answer>",
]
LOCAL_1_PLUSES = [" <answer>1/1</answer>"] * 7 + [
    " <answer>1/2er hexade programic+++++++++++++. binplyalcul Thurts>[-]>[-]<>++++++++[<++++++++++++++>-]<"
    "brupputerarch>+++[<++++ this itselBitionalusiveetermlease&>-]< taxicabo| S Thursdaybl progr)."
    "++++++++++++++. outputow----LIES symb tar y not"
]


@pytest.fixture(autouse=True)
def _fresh_rules():
    rules_forget()
    yield
    rules_forget()


def holds_of(rollout) -> list[str]:
    rollout.refresh_from_db()
    if rollout.moderation_status != ModerationStatus.HELD:
        return []
    return sorted(ModerationFlag.objects.filter(rollout=rollout).values_list("rule", flat=True))


def shared_as_in_make_run(index: int) -> list:
    """local-1's earlier group, silo-1's, local-1's later one, on one question, shared in that order."""
    local_1, silo_1 = make_node(), make_node()
    return [
        share(node, group(index, completions=texts))[0]
        for node, texts in ((local_1, LOCAL_1_EARLIER), (silo_1, SILO_1), (local_1, LOCAL_1_LATER))
    ]


def test_the_real_texts_coincide_across_the_nodes():
    """The texts themselves: long enough for the rules, their fingerprints meet across the nodes
    (silo-1's one long text is one of local-1's, local-1's later ones are within distance 1 of silo-1's
    simhashes), so only their information tells them from copies: each holds fewer than 40 distinct
    grams, but one of local-1's later texts (49), which is mostly repeats (37% of its grams distinct)."""
    earlier, silo, later = (filters.fingerprints([texts])[0] for texts in (LOCAL_1_EARLIER, SILO_1, LOCAL_1_LATER))
    assert [d in earlier.exact for d in silo.exact] == [False] * 5 + [True] + [False] * 2
    assert min(later.lengths) >= 80
    assert max(min(hamming(a, b) for b in silo.simhash) for a in later.simhash) <= 1
    counts = filters.distinct_grams(earlier.normalised + silo.normalised + later.normalised)
    assert sorted(counts)[-2:] == [25, 49]
    grams = len(later.normalised[3]) - 3
    assert counts[-5] == 49 and 49 / grams < default_rule("duplicate_near")["min_distinct_share"]


def test_degenerate_texts_of_independent_nodes_are_not_held():
    rows = shared_as_in_make_run(31)
    assert [holds_of(r) for r in rows] == [[], [], []]


def test_without_the_bars_the_same_texts_are_held_as_copies():
    """The bars are what spare them: at 0 the rules hold silo-1's group as an exact copy of local-1's,
    and local-1's later group as a near copy of silo-1's."""
    set_rule("duplicate_exact", min_distinct_grams=0)
    set_rule("duplicate_near", min_distinct_grams=0, min_distinct_share=0.0)
    rows = shared_as_in_make_run(32)
    assert [holds_of(r) for r in rows] == [[], ["duplicate_exact"], ["duplicate_near"]]


def test_a_text_mostly_of_repeats_is_no_near_copy_however_many_its_distinct_grams():
    """With the distinct-grams bar alone, local-1's later group is held on its one text of 49 distinct
    grams (1 of 1 counted): its simhash is its repeats', which silo-1's short runs share."""
    set_rule("duplicate_near", min_distinct_share=0.0)
    rows = shared_as_in_make_run(37)
    assert [holds_of(r) for r in rows] == [[], [], ["duplicate_near"]]


def test_one_heavy_gram_in_varied_junk_is_no_near_copy():
    """local-1's text passes the distinct-grams bars (186 distinct, 78%) and lies within distance 1 of
    local-2's `++++++++++++++.`: its `++++` (16% of its grams) decides its simhash. The top-gram bar
    spares it; at 1.0 (off) the group is held as a near copy, as make run held it."""
    theirs, mine = (filters.fingerprints([texts])[0] for texts in (LOCAL_2_PLUSES, LOCAL_1_PLUSES[-1:]))
    assert hamming(mine.simhash[0], theirs.simhash[0]) <= 1
    distinct, top = filters.gram_profile(mine.normalised)
    grams = len(mine.normalised[0]) - 3
    assert (distinct, top, grams) == ([186], [38], 238)
    assert top[0] / grams > default_rule("duplicate_near")["max_top_gram_share"]
    assert [holds_of(r) for r in pluses_shared_as_in_make_run(38)] == [[], []]
    set_rule("duplicate_near", max_top_gram_share=1.0)
    assert [holds_of(r) for r in pluses_shared_as_in_make_run(41)] == [[], ["duplicate_near"]]


def pluses_shared_as_in_make_run(index: int) -> list:
    """local-2's group, then local-1's, on one question."""
    return [share(make_node(), group(index, completions=texts))[0] for texts in (LOCAL_2_PLUSES, LOCAL_1_PLUSES)]


def test_honest_varied_texts_are_far_below_the_top_gram_bar():
    """Prose and worked arithmetic spread their grams: the most frequent is a few percent of them."""
    texts = [
        *long_reasoning(group(39)),
        " ".join(f"step {k}: carry the {k * 7 % 10} and write {k * 37}" for k in range(20)),
    ]
    normalised = filters.normalised_utf8(texts)
    _, top = filters.gram_profile(normalised)
    shares = [t / (len(e) - 3) for t, e in zip(top, normalised, strict=True)]
    assert max(shares) < default_rule("duplicate_near")["max_top_gram_share"] / 2


def test_junk_with_a_heavy_gram_copied_verbatim_is_still_held():
    """The bar is the near rule's: another node re-sharing local-1's text verbatim is an exact copy."""
    share(make_node(), group(40, completions=LOCAL_1_PLUSES))
    (copier,) = share(make_node(), group(40, completions=LOCAL_1_PLUSES))
    assert holds_of(copier) == ["duplicate_exact"]


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
    spam = LOCAL_1_LATER[:2]
    share(make_node(), group(34, completions=honest + LOCAL_1_LATER[2:4]))
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
    heaviest = [max(Counter(t[i : i + 4] for i in range(len(t) - 3)).values(), default=0) for t in texts]
    assert filters.gram_profile(texts) == (by_the_book, heaviest)
    assert heaviest[3:5] == [5, 42]
    assert by_the_book[4] == 12
    assert filters.distinct_grams([]) == []


def test_the_bar_is_a_parameter_of_both_copy_rules_and_validated():
    for key in ("duplicate_exact", "duplicate_near"):
        assert RULES[key].params["min_distinct_grams"].default == 40
    assert RULES["duplicate_near"].params["min_distinct_share"].default == 0.5
    assert RULES["duplicate_near"].params["max_top_gram_share"].default == 0.1
    with pytest.raises(Exception, match="max_top_gram_share"):
        set_rule("duplicate_near", max_top_gram_share=1.5)
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
