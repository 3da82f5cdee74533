"""Scoring, and how a node turns its own and the swarm's groups into a training set."""

from __future__ import annotations

import random

import pytest
from node_toys import make_policy

from sapo_node.assemble import assemble
from sapo_node.generate import Generated
from sapo_node.groups import Group
from sapo_node.prompts import format_prompt
from sapo_node.sample import sample_questions
from sapo_node.score import score_group
from sapo_node.tasks import EASY_CATALOGUE, SAPO_CATALOGUE, TaskError, TaskRef, TaskStream, build_entry, extract_answer


def _question(index: int = 3):
    spec = EASY_CATALOGUE.get("basic_arithmetic")
    return spec, build_entry(spec, 7, index)


def test_the_last_answer_tag_is_the_answer():
    assert extract_answer("I think <answer>3</answer> no, <answer> 4 </answer>") == "4"
    assert extract_answer("the answer is 4") is None


def test_score_group_rewards_right_answers_only():
    spec, entry = _question()
    right, wrong = f" <answer>{entry['answer']}</answer>", " <answer>-999</answer>"
    assert score_group(spec, 7, entry, [right, wrong, str(entry["answer"]), ""]) == [1.0, 0.0, 0.0, 0.0]


def test_sample_questions_follow_the_stream():
    a = sample_questions(TaskStream(EASY_CATALOGUE, 3), 4)
    b = sample_questions(TaskStream(EASY_CATALOGUE, 3), 4)
    assert [q.ref for q in a] == [q.ref for q in b]
    assert all(q.spec.dataset == q.ref.dataset and q.question for q in a)


class _ScriptedStream(TaskStream):
    """A stream whose first draw is given: decimal_arithmetic index 5651 of seed 1235 divides by zero
    in reasoning-gym, so no entry can be built for it."""

    def draw(self, n):
        return [TaskRef("decimal_arithmetic", 1235, 5651)] + super().draw(n - 1)


def test_a_question_that_cannot_be_built_is_drawn_again_from_the_same_dataset():
    with pytest.raises(TaskError):
        build_entry(SAPO_CATALOGUE.get("decimal_arithmetic"), 1235, 5651)
    a = sample_questions(_ScriptedStream(SAPO_CATALOGUE, 1235), 3)
    b = sample_questions(_ScriptedStream(SAPO_CATALOGUE, 1235), 3)
    assert a[0].ref.dataset == "decimal_arithmetic" and a[0].ref.index != 5651 and a[0].question
    assert [q.ref for q in a] == [q.ref for q in b]  # still deterministic in the seed


def _external(entry, spec, *, claimed, answer=None, question=None, dataset="basic_arithmetic", index=3):
    completions = [
        f" <answer>{entry['answer']}</answer>",
        " <answer>-999</answer>",
        " I do not know",
        f" <answer>{entry['answer']}</answer>",
    ]
    return Group(
        id=f"ext-{dataset}-{answer}-{question}",
        round=1,
        task=TaskRef(dataset, 7, index),
        question=question if question is not None else entry["question"],
        answer=answer if answer is not None else entry["answer"],
        completions=completions,
        rewards=claimed,
        node="peer",
    )


def _assemble(own, external, tokenizer, n_local=4, n_external=4):
    return assemble(
        own,
        external,
        n_local=n_local,
        n_external=n_external,
        rng=random.Random(0),
        catalogue=EASY_CATALOGUE,
        tokenizer=tokenizer,
        format_prompt=format_prompt,
        max_tokens=64,
    )


def test_external_groups_are_rescored_and_retokenised_by_the_receiver():
    _, tok = make_policy("b")
    spec, entry = _question()
    liar = _external(entry, spec, claimed=[0.0, 1.0, 1.0, 0.0])  # claimed rewards are all wrong
    train, stats = _assemble([], [liar], tok)
    assert stats.external_kept == 1 and stats.external_rescored == 4
    (group,) = train
    assert group.source == "external" and group.rewards == [1.0, 0.0, 0.0, 1.0]
    assert tok.decode(group.prompt_ids) == format_prompt(tok, entry["question"])
    for text, ids in zip(liar.completions, group.completion_ids, strict=True):
        # No EOS: the receiver cannot tell a completion the sender's model ended from one its
        # max-new-tokens cut off, and must not learn to stop where a sender was cut off.
        assert tok.eos_token_id not in ids
        assert tok.decode(ids) == text


def test_a_completion_the_sender_cut_off_is_not_taught_to_stop_where_it_was_cut():
    _, tok = make_policy("b")
    spec, entry = _question()
    group = _external(entry, spec, claimed=[1.0, 0.0, 0.0, 1.0])
    # A sender whose max-new-tokens ended this completion mid-answer: it shares the text as it was cut.
    group.completions[2] = " <answer>1"
    cut_ids = tok(" <answer>1", add_special_tokens=False)["input_ids"]
    long_text = " " + "9" * 200
    group.completions[1] = long_text
    train, _ = assemble(
        [],
        [group],
        n_local=0,
        n_external=1,
        rng=random.Random(0),
        catalogue=EASY_CATALOGUE,
        tokenizer=tok,
        format_prompt=format_prompt,
        max_tokens=16,
    )
    (tg,) = train
    assert tg.completion_ids[2] == cut_ids  # no EOS after the cut
    assert len(tg.completion_ids[1]) == 16 and tok.eos_token_id not in tg.completion_ids[1]  # overlong: cut, no EOS


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"answer": "12345"}, "answer_mismatch"),
        ({"question": "What is 1 + 1?"}, "question_mismatch"),
        ({"dataset": "bf"}, "unknown_task"),
        ({"index": -1}, "bad_index"),
    ],
)
def test_external_groups_that_do_not_verify_are_dropped(kwargs, reason):
    _, tok = make_policy("a")
    spec, entry = _question()
    group = _external(entry, spec, claimed=[1.0, 0.0, 0.0, 1.0], **kwargs)
    train, stats = _assemble([], [group], tok)
    assert train == [] and stats.external_invalid == 1 and stats.reasons == {reason: 1}


def test_zero_advantage_groups_are_dropped_and_counts_respected():
    _, tok = make_policy("a")
    spec, entry = _question()

    def own(rewards, i):
        g = Group.new(
            round=1,
            task=TaskRef("basic_arithmetic", 7, 3),
            question=entry["question"],
            answer=entry["answer"],
            completions=["x"] * len(rewards),
            rewards=rewards,
        )
        return g, Generated([1, 2], [[3, i]] * len(rewards), ["x"] * len(rewards), [False] * len(rewards))

    owns = [own([1.0, 0.0], 1), own([0.0, 0.0], 2), own([1.0, 1.0], 3), own([0.0, 1.0], 4), own([0.5, 0.0], 5)]
    external = [_external(entry, spec, claimed=[1.0, 0.0, 0.0, 1.0])]
    train, stats = _assemble(owns, external, tok, n_local=2, n_external=1)
    assert [g.source for g in train] == ["local", "local", "external"]
    assert all(g.informative for g in train)
    assert stats.zero_advantage == 2 and stats.zero_advantage_share == pytest.approx(2 / 6)
    assert (stats.local_offered, stats.local_kept, stats.external_offered, stats.external_kept) == (5, 2, 1, 1)


def test_a_task_without_a_single_answer_is_shared_as_null_and_verifies():
    from sapo_node.tasks import SAPO_CATALOGUE

    (question,) = [
        q for q in sample_questions(TaskStream(SAPO_CATALOGUE, 1), 40) if q.ref.dataset == "propositional_logic"
    ][:1]
    assert question.answer is None
    group = Group.new(
        round=1,
        task=question.ref,
        question=question.question,
        answer=None,
        completions=["<answer>P</answer>", "no"],
        rewards=[0.0, 0.0],
    )
    wire = group.to_wire()
    assert wire["answer"] is None and Group.from_wire(wire).answer is None
    _, tok = make_policy("a")
    _, stats = assemble(
        [],
        [group],
        n_local=0,
        n_external=1,
        rng=random.Random(0),
        catalogue=SAPO_CATALOGUE,
        tokenizer=tok,
        format_prompt=format_prompt,
        max_tokens=16,
    )
    assert stats.external_invalid == 0  # re-verified (then dropped only for carrying no signal)
