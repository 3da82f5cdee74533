"""Corrected and gated sharing (docs/node.md, "Corrected and gated sharing"): the importance weights of
external completions against hand-computed tensors, the sharer's log-probabilities matched to this
node's tokens, the success gate and the learning zone in assemble, and on-policy groups training
exactly as without the options."""

from __future__ import annotations

import dataclasses
import math
import random

import msgspec
import pytest
import torch
from node_toys import make_policy

from sapo_node import proof
from sapo_node.assemble import assemble
from sapo_node.cli import build_parser
from sapo_node.config import NodeConfig
from sapo_node.generate import encode_prompt
from sapo_node.groups import ExternalRules, Group, TrainGroup, has_success, make_proof, sharer_logprobs
from sapo_node.grpo import clipped_loss, collate_groups, completion_logprobs, grpo_update, importance_weights
from sapo_node.loop import play_round, start_node
from sapo_node.prompts import format_prompt
from sapo_node.tasks import EASY_CATALOGUE, TaskRef, build_entry
from sapo_node.transport import MemoryPool, MemoryTransport

MODEL = "tiny-mini"


def _log(rows):
    return torch.log(torch.tensor(rows, dtype=torch.float64)).float()


def _weights_case():
    # Probabilities, not log-probabilities, so the ratios read off: row 0 (A = +1) has ratios 2, 0.5, 3;
    # rows 1 and 3 have ratios 0.5, 2/3 and a padded last token (row 1 A = -1, row 3 A = +1); row 2 has no
    # sharer log-probabilities (an own completion).
    old = _log([[0.5, 0.2, 0.9], [0.3, 0.6, 1.0], [0.5, 0.5, 0.5], [0.3, 0.6, 1.0]])
    sharer = _log([[0.25, 0.4, 0.3], [0.6, 0.9, 1.0], [0.1, 0.1, 0.1], [0.6, 0.9, 1.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 0]])
    old, sharer = old * mask, sharer * mask  # padding holds 0, as completion_logprobs and collate_sharer write it
    has = torch.tensor([True, True, False, True])
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0])
    return old, sharer, has, adv, mask


def test_token_correction_truncates_each_tokens_ratio_at_the_cap():
    old, sharer, has, adv, mask = _weights_case()
    w, stats = importance_weights(old, sharer, has, adv, mask, correction="token", cap=2.0)
    expected = torch.tensor([[2.0, 0.5, 2.0], [0.5, 2 / 3, 1.0], [1.0, 1.0, 1.0], [0.5, 2 / 3, 1.0]])
    torch.testing.assert_close(w * mask, expected * mask)
    assert torch.equal(w[2], torch.ones(3))  # no sharer log-probabilities: exactly 1
    assert stats["corrected"].item() == 3 and stats["filtered"].item() == 0
    assert stats["weight_sum"].item() == pytest.approx(2 + 0.5 + 2 + 2 * (0.5 + 2 / 3), rel=1e-6)


def test_sequence_correction_weights_a_completion_by_its_truncated_product_of_ratios():
    old, sharer, has, adv, mask = _weights_case()
    w, _ = importance_weights(old, sharer, has, adv, mask, correction="sequence", cap=2.0)
    # row 0: 2 * 0.5 * 3 = 3, truncated to 2; rows 1 and 3: 0.5 * 2/3 = 1/3
    expected = torch.tensor([[2.0] * 3, [1 / 3] * 3, [1.0] * 3, [1 / 3] * 3])
    torch.testing.assert_close(w * mask, expected * mask)


def test_the_offpolicy_filter_zeroes_negative_advantage_completions_far_from_this_policy():
    old, sharer, has, adv, mask = _weights_case()
    # Rows 1 and 3: mean of log(p_sharer / p_node) over their two tokens = (log 2 + log 1.5) / 2 = log(3) / 2 = 0.549.
    w, stats = importance_weights(old, sharer, has, adv, mask, correction="off", filter_kl=0.5)
    assert torch.equal(w[1], torch.zeros(3))  # A < 0 and 0.549 > 0.5
    assert torch.equal(w[3], torch.ones(3))  # the same tokens at A > 0 stay
    assert torch.equal(w[2], torch.ones(3))  # A < 0 but no sharer log-probabilities
    assert torch.equal(w[0], torch.ones(3))  # correction off: weight 1
    assert stats["filtered"].item() == 1 and stats["corrected"].item() == 0
    kept, stats = importance_weights(old, sharer, has, adv, mask, correction="token", filter_kl=0.6)
    assert stats["filtered"].item() == 0 and kept[1, 0].item() == pytest.approx(0.5)


def test_clipped_loss_weights_each_tokens_policy_term_by_hand():
    # As test_grpo's hand case, with weights: row 0 has A = +1 and ratios 1, 1.5, 0.5; row 1 A = -1 and
    # ratios 1, 0.5 (its last token is padding).
    old = torch.zeros(2, 3)
    logp = torch.log(torch.tensor([[1.0, 1.5, 0.5], [1.0, 0.5, 2.0]])).requires_grad_(True)
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    weights = torch.tensor([[2.0, 1.0, 0.5], [0.5, 1.0, 7.0]])
    loss, _ = clipped_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28, weights=weights)
    # per token: row 0: -1 * 2, -1.28 * 1, -0.5 * 0.5; row 1: 1 * 0.5, 0.8 * 1, (masked)
    torch.testing.assert_close(loss, torch.tensor((-2.0 - 1.28 - 0.25 + 0.5 + 0.8) / 5))
    loss.backward()
    # d/dlogp of -w * A * ratio / 5 where not clipped, 0 where clipped or masked
    expected = torch.tensor([[-2.0 / 5, 0.0, -0.25 / 5], [0.5 / 5, 0.0, 0.0]])
    torch.testing.assert_close(logp.grad, expected)


def _groups(tok):
    eos = tok.eos_token_id
    prompt = encode_prompt(tok, "Question: What is 2 + 3?\nAnswer:")
    good = tok(" <answer>5</answer>", add_special_tokens=False)["input_ids"] + [eos]
    bad = tok(" <answer>7</answer>", add_special_tokens=False)["input_ids"] + [eos]
    other = encode_prompt(tok, "Question: What is 4 + 4?\nAnswer:")
    return [
        TrainGroup("own", "local", prompt, [good, bad, good, bad], [1.0, 0.0, 1.0, 0.0]),
        TrainGroup("ext", "external", other, [bad, good, [10, 11, eos]], [0.0, 1.0, 0.0]),
    ]


def _old_logprobs(model, group, pad):
    """The log-probabilities grpo_update's first forward pass computes for the group's rows (one micro-batch)."""
    with torch.no_grad():
        batch = collate_groups([(group.prompt_ids, c, 0.0) for c in group.completion_ids], pad, "cpu")
        logp = completion_logprobs(model, batch)
    return [row[: len(c)].tolist() for row, c in zip(logp, group.completion_ids, strict=True)]


def _update(groups, seed, **options):
    model, tok = make_policy("a", seed=seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    stats = grpo_update(model, optimizer, groups, pad_id=tok.pad_token_id, micro_batch=16, **options)
    return [p.detach().clone() for p in model.parameters()], stats


OPTIONS_ON = {"correction": "token", "correction_cap": 2.0, "filter_kl": 0.0}


@pytest.mark.parametrize("correction", ["token", "sequence"])
def test_on_policy_groups_train_exactly_as_without_the_options(correction):
    model, tok = make_policy("a", seed=11)
    own, ext = _groups(tok)
    plain, plain_stats = _update([own, ext], 11)
    # Own groups carry no sharer log-probabilities: bitwise the same update with every option on.
    on, stats = _update([own, ext], 11, correction=correction, correction_cap=2.0, filter_kl=0.0)
    assert all(torch.equal(a, b) for a, b in zip(plain, on, strict=True))
    assert stats.loss == plain_stats.loss and stats.corrected == 0
    # An external group whose sharer sampled with this very policy: every ratio is 1.
    ext.sharer_logprobs = _old_logprobs(model, ext, tok.pad_token_id)
    on, stats = _update([own, ext], 11, correction=correction, correction_cap=2.0, filter_kl=0.0)
    assert stats.corrected == 3 and stats.filtered == 0
    assert stats.correction_weight == pytest.approx(1.0, abs=1e-7)
    for a, b in zip(plain, on, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7)


@pytest.mark.parametrize(("correction", "shift"), [("token", 1.0), ("sequence", math.log(2))])
def test_a_truncated_weight_scales_the_external_groups_loss_and_gradient(correction, shift):
    model, tok = make_policy("a", seed=12)
    _, ext = _groups(tok)
    plain, plain_stats = _update([ext], 12, max_grad_norm=1e9)
    # The sharer gave each token less probability than this node (ratio e per token, or 2^T per
    # completion): every weight is truncated to the cap, exactly 2, so the loss and the gradient double.
    ext.sharer_logprobs = [[x - shift for x in row] for row in _old_logprobs(model, ext, tok.pad_token_id)]
    _, stats = _update([ext], 12, max_grad_norm=1e9, correction=correction, correction_cap=2.0)
    assert stats.loss == pytest.approx(2 * plain_stats.loss, rel=1e-6)
    assert stats.grad_norm == pytest.approx(2 * plain_stats.grad_norm, rel=1e-5)
    assert stats.correction_weight == pytest.approx(2.0)


def test_the_offpolicy_filter_drops_the_external_groups_far_negative_completions_from_the_update():
    model, tok = make_policy("a", seed=13)
    _, ext = _groups(tok)
    old = _old_logprobs(model, ext, tok.pad_token_id)
    # The sharer put 1 nat more on every token than this node: KL estimate 1 per token.
    ext.sharer_logprobs = [[x + 1.0 for x in row] for row in old]
    _, stats = _update([ext], 13, filter_kl=0.5)
    assert stats.filtered == 2  # the two completions of reward 0 (negative advantage); the right one stays
    # Equal to training on the right completion alone, within the same token count.
    ext_plain = TrainGroup("ext", "external", ext.prompt_ids, ext.completion_ids, ext.rewards)
    _, plain = _update([ext_plain], 13)
    assert stats.loss < plain.loss  # the filtered completions' positive loss terms are gone
    _, none = _update([ext], 13, filter_kl=1.5)
    assert none.filtered == 0 and none.loss == pytest.approx(plain.loss)


# ---------------------------------------------------------------------------- the sharer's log-probabilities


def _question(index: int = 3):
    spec = EASY_CATALOGUE.get("basic_arithmetic")
    return spec, build_entry(spec, 7, index)


def _shared(tok, completions, *, model=MODEL, temperature=1.0, index=3, eos=True):
    spec, entry = _question(index)
    ids = [
        tok(text, add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if eos else []) for text in completions
    ]
    lps = [[-0.25 - t / 64 for t in range(len(row))] for row in ids]  # exact in float32
    group = Group(
        id=f"ext-{index}-{model}",
        round=1,
        task=TaskRef("basic_arithmetic", 7, index),
        question=entry["question"],
        answer=entry["answer"],
        completions=list(completions),
        rewards=[0.0] * len(completions),
        node="peer",
    )
    group.proof = make_proof(
        challenge="c", weights="ab" * 32, model=model, temperature=temperature, completion_ids=ids, logprobs=lps
    )
    return group, ids, lps


def test_the_sharers_logprobs_apply_to_this_nodes_tokens_of_the_same_model_without_the_stop():
    _, tok = make_policy("a")
    group, ids, lps = _shared(tok, [" <answer>16</answer>", " no idea"])
    mine = [row[:-1] for row in ids]  # this node re-tokenises the text: no stop token
    aligned, why = sharer_logprobs(group, mine, model=MODEL)
    assert why == "" and aligned == [row[:-1] for row in lps]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"model": "smollm2-135m"}, "other_model"),
        ({"temperature": 0.0}, "greedy"),
    ],
)
def test_a_proof_of_another_model_or_a_greedy_one_is_not_used(change, reason):
    _, tok = make_policy("a")
    group, ids, _ = _shared(tok, [" <answer>16</answer>", " no idea"], **change)
    assert sharer_logprobs(group, [row[:-1] for row in ids], model=MODEL) == (None, reason)


def test_tokens_that_differ_from_this_nodes_and_malformed_logprobs_are_not_used():
    _, tok = make_policy("a")
    _, other = make_policy("b")  # another tokenizer under the same model name (it splits digits)
    group, ids, lps = _shared(tok, [" 2024 is 1234", " no idea"])
    theirs = [other(t, add_special_tokens=False)["input_ids"] for t in group.completions]
    assert sharer_logprobs(group, theirs, model=MODEL) == (None, "tokens_differ")
    mine = [row[:-1] for row in ids]
    assert sharer_logprobs(dataclasses.replace(group, proof=None), mine, model=MODEL) == (None, "no_proof")
    # What a forger may send (the server refuses these, but a node trusts nothing of the pool's):
    # a positive log-probability, a NaN, one more log-probability than tokens.
    for bad in ([0.5] * len(ids[1]), [math.nan] * len(ids[1]), [-1.0] * (len(ids[1]) + 1)):
        forged = dataclasses.replace(
            group, proof=msgspec.structs.replace(group.proof, logprobs=list(group.proof.logprobs))
        )
        forged.proof.logprobs[1] = proof.encode_floats(bad)
        assert sharer_logprobs(forged, mine, model=MODEL) == (None, "malformed")
    assert sharer_logprobs(group, mine, model=MODEL)[1] == ""  # the original was left as it was


# ---------------------------------------------------------------------------- assemble's gates


def _assemble(external, tok, rules, n_external=4, seed=0):
    return assemble(
        [],
        external,
        n_local=0,
        n_external=n_external,
        rng=random.Random(seed),
        catalogue=EASY_CATALOGUE,
        tokenizer=tok,
        format_prompt=format_prompt,
        max_tokens=64,
        rules=rules,
    )


def test_assemble_attaches_the_sharers_logprobs_or_skips_the_group_by_the_mismatch_rule():
    _, tok = make_policy("a")
    right = " <answer>16</answer>"
    matched, ids, lps = _shared(tok, [right, " <answer>3</answer>"], index=3)
    foreign, _, _ = _shared(tok, [right, " <answer>3</answer>"], index=3, model="smollm2-135m")
    foreign.id = "foreign"
    rules = ExternalRules(model=MODEL, use_logprobs=True)
    train, stats = _assemble([matched, foreign], tok, rules)
    by_id = {g.id: g for g in train}
    assert by_id[matched.id].sharer_logprobs == [row[:-1] for row in lps]
    assert by_id["foreign"].sharer_logprobs is None  # uncorrected: trained with weight 1
    assert stats.external_corrected == 1 and stats.external_uncorrected == {"other_model": 1}
    train, stats = _assemble([matched, foreign], tok, ExternalRules(model=MODEL, use_logprobs=True, mismatch="skip"))
    assert [g.id for g in train] == [matched.id] and stats.external_uncorrected == {"other_model": 1}
    plain, _ = _assemble([matched, foreign], tok, ExternalRules())
    assert all(g.sharer_logprobs is None for g in plain) and len(plain) == 2


def test_the_success_gate_keeps_only_groups_with_a_verified_correct_completion():
    _, tok = make_policy("a")
    spec, entry = _question(3)
    answer = str(entry["answer"])
    # basic_arithmetic gives partial credit to a near answer: informative, yet nothing right.
    near, _, _ = _shared(tok, [f" <answer>{answer}0</answer>", " <answer>x</answer>"], index=3)
    solved, _, _ = _shared(tok, [f" <answer>{answer}</answer>", " <answer>x</answer>"], index=3)
    solved.id = "solved"
    train, stats = _assemble([near, solved], tok, ExternalRules())
    assert {g.id for g in train} == {near.id, "solved"}
    train, stats = _assemble([near, solved], tok, ExternalRules(success_gate=True))
    assert [g.id for g in train] == ["solved"] and stats.external_no_success == 1
    assert len(stats.external_rewards) == 4  # the gated group's rewards still count as received
    assert has_success([0.0, 1.0]) and not has_success([0.0, 0.6666666666666666])


def test_the_learning_zone_is_chosen_first_and_the_rest_only_fills_j():
    _, tok = make_policy("a")
    spec, entry = _question(3)
    answer = str(entry["answer"])
    right, wrong = f" <answer>{answer}</answer>", " <answer>x</answer>"
    easy, _, _ = _shared(tok, [right, right, right, right, wrong], index=3)  # mean 0.8
    even, _, _ = _shared(tok, [right, wrong], index=3)  # mean 0.5
    easy.id, even.id = "easy", "even"
    zone = ExternalRules(zone=(0.1, 0.7))
    for seed in range(8):
        train, _ = _assemble([easy, even], tok, zone, n_external=1, seed=seed)
        assert [g.id for g in train] == ["even"]
    train, _ = _assemble([easy, even], tok, zone, n_external=2)
    assert [g.id for g in train] == ["even", "easy"]  # outside the zone only to fill J
    picks = {_assemble([easy, even], tok, ExternalRules(), n_external=1, seed=s)[0][0].id for s in range(8)}
    assert picks == {"easy", "even"}  # no zone: uniform


def test_the_options_are_in_run_help_and_validated():
    run = build_parser()._subparsers._group_actions[0].choices["run"]
    text = run.format_help()
    for flag in (
        "--correction CORRECTION",
        "--correction-cap C",
        "--correction-mismatch CORRECTION_MISMATCH",
        "--offpolicy-filter",
        "--success-gate",
        "--learning-zone-low",
        "--learning-zone-high",
    ):
        assert flag in text, flag
    args = build_parser().parse_args(["run", "--correction", "token", "--offpolicy-filter", "0.5", "--success-gate"])
    assert (args.correction, args.offpolicy_filter, args.success_gate) == ("token", 0.5, True)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--correction", "both"])
    for bad in (
        {"correction_cap": 0.5},
        {"learning_zone_low": 0.9, "learning_zone_high": 0.1},
        {"offpolicy_filter": -1.0},
    ):
        with pytest.raises(ValueError):
            NodeConfig(**bad).resolved()


# ---------------------------------------------------------------------------- through the loop

CHALLENGE = "c1.test.1700000000000.00112233445566aa.0123456789abcdef0123456789abcdef"


def _loop_node(tmp_path, pool, name, model, **options):
    config = NodeConfig(
        out=str(tmp_path / name),
        rounds=2,
        questions=3,
        generations=2,
        max_new_tokens=6,
        local=1,
        external=3,
        checkpoint_every=0,
        connect_wait=0,
        model=model,
        seed=1,
        **options,
    )
    return start_node(config, MemoryTransport(pool, name), policy=make_policy("a", seed=len(name)))


def test_a_correcting_node_reads_the_log_probabilities_of_its_peers_groups_of_its_own_model(tmp_path):
    pool = MemoryPool(EASY_CATALOGUE, only_informative=False, challenge=CHALLENGE)
    play_round(_loop_node(tmp_path, pool, "sharer", "toy-a"))  # 3 groups, each with its proof
    same = play_round(_loop_node(tmp_path, pool, "same", "toy-a", correction="token"))
    # An untrained policy's random tokens may not come back from their text (tokens_differ): uncorrected.
    assert same["external_corrected"] >= 1 and same["external_corrected"] + same["external_uncorrected"] == 3
    other = play_round(_loop_node(tmp_path, pool, "other", "toy-b", correction="token"))
    assert (other["external_corrected"], other["external_uncorrected"]) == (0, 3)  # another model's tokens
    plain = play_round(_loop_node(tmp_path, pool, "plain", "toy-a"))
    assert (plain["external_corrected"], plain["external_uncorrected"], plain["corrected"]) == (0, 0, 0)
