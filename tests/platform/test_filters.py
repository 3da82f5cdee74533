"""The automatic rules at ingest: each catches its case, leaves a clean group alone, and is audited."""

from __future__ import annotations

import random
import uuid

import pytest
from factories import make_node
from support.moderation import group, hamming, long_reasoning, set_rule, share

from moderation import filters, kernels, safe_regex
from moderation.models import AuditEntry, ModerationDecision, ModerationFlag, RolloutFingerprint
from moderation.rules import RULES, Rule, default_rule, rules_forget
from moderation.screening import outlier_scan, outlier_scores
from pool.models import ModerationStatus, Rollout

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_rules():
    rules_forget()
    yield
    rules_forget()


def flags_of(rollout) -> list[str]:
    return sorted(ModerationFlag.objects.filter(rollout=rollout).values_list("rule", flat=True))


def assert_clean(rollout) -> None:
    rollout.refresh_from_db()
    assert rollout.moderation_status == ModerationStatus.OK
    assert rollout.sampleable
    assert flags_of(rollout) == []


def assert_held(rollout, rule: str) -> None:
    rollout.refresh_from_db()
    assert rollout.moderation_status == ModerationStatus.HELD
    assert not rollout.sampleable
    assert rule in flags_of(rollout)
    decision = ModerationDecision.objects.get(rollout=rollout)
    assert decision.rule == rule and decision.status == "held"
    assert AuditEntry.objects.filter(rule=rule, action="auto_hold", target_id=str(rollout.id)).exists()


# --- verification ---------------------------------------------------------------------------------


def test_a_verification_mismatch_is_an_audited_automatic_verdict():
    node = make_node()
    forged = group(3)
    forged["rewards"] = [1.0] * len(forged["completions"])
    good = group(4)
    bad_row, good_row = share(node, forged, good)
    assert bad_row.verdict == "rejected" and bad_row.reason == "reward_mismatch"
    entry = AuditEntry.objects.get(action="auto_verdict", target_id=str(bad_row.id))
    assert entry.rule == "verification" and entry.actor is None and entry.reason == "reward_mismatch"
    assert not AuditEntry.objects.filter(target_id=str(good_row.id)).exists()
    assert_clean(good_row)


# --- copies ---------------------------------------------------------------------------------------


def test_an_exact_copy_of_another_nodes_group_is_held_and_the_original_is_not():
    author, copier, honest = make_node(), make_node(), make_node()
    g = group(11)
    (original,) = share(author, group(11, completions=long_reasoning(g)))
    (copy,) = share(copier, group(11, completions=[c.upper() + "  " for c in long_reasoning(g)]))  # same normalised
    (own_words,) = share(honest, group(11, completions=long_reasoning(g, variant=" in a completely different way")))
    assert_clean(original)
    assert_held(copy, "duplicate_exact")
    flag = ModerationFlag.objects.get(rollout=copy)
    assert flag.data["sources"] == [str(original.id)]
    assert "duplicate_exact" not in flags_of(own_words)


def test_the_same_node_resharing_its_own_text_is_not_a_copy():
    node = make_node()
    g = group(12)
    share(node, group(12, completions=long_reasoning(g)))
    (again,) = share(node, group(12, completions=long_reasoning(g)))
    assert_clean(again)


# --- fingerprints without database constraints -----------------------------------------------------
# A fingerprint's two foreign keys are not constraints in PostgreSQL (two trigger checks per row, 32
# rows a share; docs/moderation.md, "Cost"): Django's delete cascades them. These hold that every way
# a group or a node is deleted here (the ORM: admin pages, a user's deletion) still takes them along.


def _fingerprinted(node, index):
    g = group(index)
    (row,) = share(node, group(index, completions=long_reasoning(g, variant=f" {node.id}")))
    assert RolloutFingerprint.objects.filter(rollout_id=row.id, node_id=node.id).exists()
    return row


def test_deleting_a_group_deletes_its_fingerprint():
    node = make_node()
    kept, gone = _fingerprinted(node, 21), _fingerprinted(node, 22)
    Rollout.objects.filter(id=gone.id).delete()
    assert set(RolloutFingerprint.objects.values_list("rollout_id", flat=True)) == {kept.id}
    gone_alone = _fingerprinted(node, 23)
    gone_alone.delete()
    assert set(RolloutFingerprint.objects.values_list("rollout_id", flat=True)) == {kept.id}


def test_deleting_a_node_or_its_contributor_deletes_its_fingerprints():
    kept_node, node, other = make_node(), make_node(), make_node()
    kept = _fingerprinted(kept_node, 24)
    _fingerprinted(node, 25)
    _fingerprinted(other, 26)
    node.delete()
    other.owner.delete()
    assert list(RolloutFingerprint.objects.values_list("rollout_id", flat=True)) == [kept.id]


def test_a_deleted_groups_fingerprint_is_no_copy_source():
    author, copier = make_node(), make_node()
    g = group(27)
    (original,) = share(author, group(27, completions=long_reasoning(g)))
    Rollout.objects.filter(id=original.id).delete()
    (later,) = share(copier, group(27, completions=long_reasoning(g)))
    assert_clean(later)


def test_short_identical_answers_are_not_copies():
    g = group(13)
    short = [f"<answer>{g['answer']}</answer>", "<answer>1</answer>"]
    share(make_node(), group(13, completions=short))
    (second,) = share(make_node(), group(13, completions=short))
    assert_clean(second)


@pytest.mark.parametrize("near", [False, True], ids=["exact", "near"])
def test_only_long_completions_count_toward_a_groups_share_of_copies(near):
    """copy_findings: completions shorter than min_chars are neither looked up nor counted; a group with
    none long enough is no copy, whatever it says."""
    long_texts = [f"a completion long enough to count, number {k}, with its own words" for k in range(3)]
    source = uuid.uuid4()
    (stored,) = filters.fingerprints([long_texts])
    index = filters.CopyIndex(source.bytes, [3], stored.exact_bytes(), stored.simhash_packed)
    key = "duplicate_near" if near else "duplicate_exact"
    rule_ = rule(key, min_chars=40, min_share=0.6)
    groups = [
        [long_texts[0], "short", long_texts[1], "tiny"],  # 2 of 2 long ones copied
        [long_texts[0], "short", "its own long completion, nothing like the stored ones at all"],  # 1 of 2
        ["short", "tiny", long_texts[0][:10]],  # nothing long enough
        long_texts,  # 3 of 3
    ]
    found = filters.copy_findings(filters.fingerprints(groups), index, rule_, near=near)
    kind = "near copies" if near else "exact copies"
    assert found == [
        (f"2 of 2 completions are {kind} of other nodes' groups", [str(source)]),
        None,
        None,
        (f"3 of 3 completions are {kind} of other nodes' groups", [str(source)]),
    ]


def test_a_near_copy_is_caught_by_the_near_rule():
    g = group(14)
    share(make_node(), group(14, completions=long_reasoning(g)))
    tweaked = [c.replace("carefully", "carefuly") for c in long_reasoning(g)]  # one typo per completion
    (near,) = share(make_node(), group(14, completions=tweaked))
    assert_held(near, "duplicate_near")


def test_simhash_distance_is_small_for_near_texts_and_large_for_different_ones():
    a = filters.simhash(filters.normalise("the quick brown fox jumps over the lazy dog " * 4))
    b = filters.simhash(filters.normalise("the quick brown fox jumps over the lazy cat " * 4))
    c = filters.simhash(filters.normalise("completely unrelated text about arithmetic and carrying digits"))
    assert hamming(a, b) <= 8
    assert hamming(a, c) > 12


def _simhash_by_the_book(text: str) -> int:
    """docs/moderation.md's simhash, one gram at a time: what the vectorised one must equal bit for bit
    (the stored fingerprints of earlier groups are compared with new ones)."""
    data = text[: filters.SIMHASH_CHARS].encode("utf-8").ljust(kernels.SHINGLE, b"\0")
    mask = (1 << 64) - 1
    ones = [0] * 64
    windows = len(data) - kernels.SHINGLE + 1
    for start in range(windows):
        h = 0
        for byte in data[start : start + kernels.SHINGLE]:
            h = (h * 1099511628211 + byte + 1) & mask
        for mul in (0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53, None):  # murmur3's finaliser
            h ^= h >> 33
            h = h if mul is None else (h * mul) & mask
        for bit in range(64):
            ones[bit] += h >> bit & 1
    value = sum(1 << bit for bit in range(64) if 2 * ones[bit] > windows)
    return value - (1 << 64) if value >> 63 else value


def test_fingerprints_of_a_share_equal_each_texts_own_by_the_book():
    # lengths around the simhash's 255-gram chunks, the 4000-character cut, padding and non-ASCII
    texts = ["", "a", "abc", "word " * 51 + "xy", "word " * 52, "step " * 120, "é" * 300, "x y" * 1500]
    texts += ["  Mixed\tCase\x1cand\n\nspaces  ", "ＡＢＣ ﬁ Straße\u2028end", "tabs\x0b\x0cand\r\nlines " * 30]
    (fp,) = filters.fingerprints([texts])
    normalised = [filters.normalise(t) for t in texts]
    assert fp.lengths == [len(n) for n in normalised]
    assert fp.simhash == [_simhash_by_the_book(n) for n in normalised]
    assert fp.simhash_packed == filters.simhash_bytes(fp.simhash)  # what is stored, the same hashes
    assert fp.exact == [filters.fingerprints([[t]])[0].exact[0] for t in texts]
    assert len(set(fp.exact)) == len(texts)


def _near_by_definition(added: list[tuple[str, int]], probe: int, distance: int) -> str | None:
    for band in range(kernels.BANDS):
        value = (probe >> (16 * band)) & 0xFFFF
        sharing = [(g, h) for g, h in added if (h >> (16 * band)) & 0xFFFF == value]
        for g, h in sharing[: filters.BAND_BUCKET]:
            if hamming(probe, h) <= distance:
                return g
    return None


@pytest.mark.parametrize("native", [True, False], ids=["c", "numpy"])
def test_near_lookups_find_the_first_candidate_within_the_distance_band_by_band(native, settings):
    """The index's answer, against its definition applied pair by pair: for each band in order, the
    first BAND_BUCKET candidates sharing its value, in the order added; the first within the distance.
    With the C extension and with its numpy twin; buckets overflow (a few bases, hundreds of hashes)."""
    settings.SAPO_NATIVE = native
    rng = random.Random(3)

    def near(base: int, flips: int) -> int:
        for bit in rng.sample(range(64), flips):
            base ^= 1 << bit
        return base - (1 << 64) if base >> 63 else base

    for _ in range(50):
        bases = [rng.getrandbits(64) for _ in range(rng.randint(1, 3))] if rng.random() < 0.8 else [0]
        ids: list[uuid.UUID] = []
        counts: list[int] = []
        added: list[tuple[str, int]] = []
        for _ in range(rng.randint(1, 40)):
            hashes = [near(rng.choice(bases), rng.randint(0, 12)) for _ in range(rng.randint(0, 10))]
            ids.append(uuid.uuid4())
            counts.append(len(hashes))
            added += [(str(ids[-1]), h) for h in hashes]
        # The groups as the screening query hands them over: bytes, ids as UUIDs.
        index = filters.CopyIndex(
            b"".join(u.bytes for u in ids),
            counts,
            bytes(filters.EXACT_BYTES * len(added)),
            filters.simhash_bytes([h for _, h in added]),
        )
        probes = [near(rng.choice(bases), rng.randint(0, 6)) for _ in range(20)]
        probes += probes[:3]  # the same hash twice gets the same answer
        for distance in (0, 3, 64):
            assert index.near_matches(probes, distance) == [_near_by_definition(added, p, distance) for p in probes]


@pytest.mark.parametrize("native", [True, False], ids=["c", "numpy"])
def test_exact_lookups_find_the_first_group_holding_the_digest(native, settings):
    """Against the definition, with digests that share their first 8 bytes (what the index compares
    first) and differ after: only the whole digest matches. With the C extension and its numpy twin."""
    settings.SAPO_NATIVE = native
    rng = random.Random(5)
    digests = [rng.randbytes(16) for _ in range(30)]
    twins = [d[:8] + rng.randbytes(8) for d in digests[:5]]  # never stored: must not match
    groups = [rng.sample(digests, rng.randint(0, 8)) for _ in range(25)]
    ids = [uuid.uuid4() for _ in groups]
    index = filters.CopyIndex(
        b"".join(u.bytes for u in ids),
        [len(g) for g in groups],
        b"".join(b"".join(g) for g in groups),
        bytes(8 * sum(map(len, groups))),
    )
    twins += [t[:8] + d[8:] for t, d in zip(twins, digests[5:10], strict=True)]  # second halves stored
    probes = [*digests, *twins, rng.randbytes(16), *digests[:4]]  # some twice
    expected = [next((str(u) for u, g in zip(ids, groups, strict=True) if p in g), None) for p in probes]
    assert index.exact_matches(probes) == expected
    assert any(expected) and not any(expected[len(digests) : len(digests) + len(twins) + 1])
    with pytest.raises(ValueError):
        filters.CopyIndex(ids[0].bytes, [2], bytes(16), bytes(16))


@pytest.mark.parametrize("native", [True, False], ids=["c", "numpy"])
def test_an_index_after_groups_finds_them_first_and_the_stored_ones_still(native, settings):
    """`CopyIndex.after`: a share's batch-mates' groups put ahead of the stored candidates."""
    settings.SAPO_NATIVE = native
    stored_id, mate_id = uuid.uuid4(), uuid.uuid4()
    texts = ["the stored one, long enough to be a completion", "the batch-mate's own text, long enough too"]
    stored_fp, mate_fp = filters.fingerprints([[texts[0]], [texts[0], texts[1]]])
    stored = filters.CopyIndex(stored_id.bytes, [1], stored_fp.exact_bytes(), stored_fp.simhash_packed)
    index = stored.after([(mate_id, mate_fp)])
    assert index.exact_matches([*mate_fp.exact, b"\0" * 16]) == [str(mate_id), str(mate_id), None]
    assert index.near_matches(mate_fp.simhash, 0) == [str(mate_id), str(mate_id)]
    assert stored.exact_matches(mate_fp.exact) == [str(stored_id), None]  # unchanged
    assert stored.after([]) is stored


# --- length and character classes -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "rule", "detail"),
    [
        ("x" * 7000 + " <answer>1</answer>", "length", "completion 2 has 7019 characters (limit 6000)"),
        ("\u200b\u200e\x07" * 30 + "<answer>1</answer>", "characters", "completion 2: 83% non-printable characters"),
        ("数学" * 40 + "<answer>1</answer>", "characters", "completion 2: 82% non-ASCII characters"),
        ("a" * 100 + "<answer>1</answer>", "characters", "completion 2: 84% repeated characters"),
    ],
    ids=["too-long", "non-printable", "non-ascii", "repeated"],
)
def test_length_and_character_limits_hold_a_group_under_the_rule_that_says_so(text, rule, detail):
    g = group(20)
    (row,) = share(make_node(), group(20, completions=[f"<answer>{g['answer']}</answer>", text]))
    assert_held(row, rule)
    assert ModerationFlag.objects.get(rollout=row, rule=rule).detail.startswith(detail)


def test_the_node_sampler_never_writes_a_character_the_characters_rule_counts():
    """sapo_node.generate's refused characters cover the rule's non-printable ones (the built-in models'
    honest groups are never held for them)."""
    from sapo_node.generate import printable

    for lo, hi in kernels.NONPRINTABLE:
        assert not any(printable(chr(c)) for c in range(lo, hi + 1)), (hex(lo), hex(hi))


def test_ordinary_text_passes_the_length_rule():
    g = group(21)
    (row,) = share(make_node(), group(21, completions=[*long_reasoning(g), "Résumé: naïve café. <answer>0</answer>"]))
    assert_clean(row)


# --- blocklist ------------------------------------------------------------------------------------


def test_a_blocklisted_pattern_holds_a_group_and_flag_only_keeps_it_sampleable():
    set_rule("blocklist", patterns=[r"buy\s+cheap\s+\w+", "casino"])
    g = group(30)
    (spam,) = share(make_node(), group(30, completions=[f"Buy  CHEAP pills <answer>{g['answer']}</answer>", "no"]))
    (clean,) = share(make_node(), group(31))
    assert_held(spam, "blocklist")
    assert_clean(clean)

    set_rule("blocklist", action="flag", patterns=["casino"])
    g = group(32)
    (flagged,) = share(make_node(), group(32, completions=[f"casino <answer>{g['answer']}</answer>", "no"]))
    flagged.refresh_from_db()
    assert flagged.moderation_status == ModerationStatus.OK and flagged.sampleable
    assert flags_of(flagged) == ["blocklist"]
    assert AuditEntry.objects.filter(rule="blocklist", action="auto_flag", target_id=str(flagged.id)).exists()


@pytest.mark.parametrize(
    "pattern",
    ["(a+)+$", "(a|aa)*b", r"(\w+)\1", "(?=x)y", "(x*)*", "a{2,}{3}", "[", "x" * 201],
    ids=[
        "nested-plus",
        "alternation-in-star",
        "backref",
        "lookahead",
        "nested-star",
        "nested-count",
        "broken",
        "too-long",
    ],
)
def test_dangerous_or_broken_patterns_are_refused(pattern):
    with pytest.raises(safe_regex.BlocklistError):
        safe_regex.validate_pattern(pattern)


def test_safe_patterns_are_accepted():
    assert safe_regex.validate_patterns([r"buy\s+cheap", r"\bhttps?://\S+", "(foo|bar) baz", "[a-z]{3,8}\\d+"])


def test_a_disabled_rule_does_nothing():
    set_rule("length", enabled=False)
    g = group(22)
    (row,) = share(make_node(), group(22, completions=["yz" * 3500, f"<answer>{g['answer']}</answer>"]))
    assert_clean(row)


# --- outlier nodes --------------------------------------------------------------------------------


def rule(key: str, **params) -> Rule:
    base = default_rule(key)
    return Rule(key, True, base.action, {**base.params, **params})


def test_outlier_scores_flag_only_the_far_node():
    means = [(1, 30, 0.40), (2, 30, 0.45), (3, 30, 0.42), (4, 30, 0.38), (5, 30, 0.99), (6, 5, 0.0)]
    outliers = outlier_scores(means, rule("outlier"))
    assert set(outliers) == {5}  # node 6 has too few groups to be judged
    assert outliers[5][0] > 3


def test_outlier_scores_need_enough_other_nodes():
    assert outlier_scores([(1, 30, 0.1), (2, 30, 0.9), (3, 30, 0.1)], rule("outlier")) == {}


def test_outlier_scan_flags_the_node_for_review_without_rejecting():
    nodes = [make_node() for _ in range(4)]
    for n, node in enumerate(nodes):
        groups = []
        for i in range(4):
            if n == 3:  # always right
                groups.append(group(100 + 10 * n + i, right=4, wrong=0))
            else:
                groups.append(group(100 + 10 * n + i, right=1, wrong=3))
        share(node, *groups)
    flags = outlier_scan(dataset="basic_arithmetic", rule=rule("outlier", min_groups=3, z_threshold=2.0))
    assert [f.node_id for f in flags] == [nodes[3].id]
    assert AuditEntry.objects.filter(rule="outlier", target_type="node", target_id=str(nodes[3].id)).exists()
    assert not nodes[3].rollouts.exclude(moderation_status=ModerationStatus.OK).exists()
    # An open flag is not repeated by the next scan.
    assert outlier_scan(dataset="basic_arithmetic", rule=rule("outlier", min_groups=3, z_threshold=2.0)) == []


def test_every_rule_has_defaults_that_validate():
    from moderation.rules import clean_params

    for key in RULES:
        assert clean_params(key, {}) == default_rule(key).params
