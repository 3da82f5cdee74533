"""A node's questions come from the server's challenge when it holds one (docs/protocol.md, "Proof of
work"): seed proof.task_seed(c), indices proof.task_index(c, j) in order of j, datasets by the
catalogue's weights; without one it draws its own as before."""

from __future__ import annotations

from sapo_node import proof
from sapo_node.sample import sample_questions
from sapo_node.tasks import EASY_CATALOGUE, SAPO_CATALOGUE, Catalogue, TaskError, TaskStream, build_entry

#: A challenge whose question 0 reasoning-gym cannot build as decimal_arithmetic (it divides by zero).
UNBUILDABLE = "test-challenge-3078"


def test_a_round_draws_the_challenges_questions_in_order_and_the_next_round_goes_on():
    stream = TaskStream(EASY_CATALOGUE, seed=3)
    stream.follow("c1.node.1.aa.bb")
    first, second = stream.draw(4), stream.draw(4)

    seed = proof.task_seed("c1.node.1.aa.bb")
    assert [(r.seed, r.index) for r in first + second] == [(seed, i) for i in proof.task_indices("c1.node.1.aa.bb")[:8]]
    assert all(stream.under_challenge(r) for r in first + second)


def test_the_newest_challenge_restarts_at_its_first_question_and_the_same_one_changes_nothing():
    stream = TaskStream(EASY_CATALOGUE, seed=3)
    stream.follow("old")
    stream.draw(3)
    stream.follow("old")
    assert stream.draw(1)[0].index == proof.task_index("old", 3)
    stream.follow("new")
    assert [r.index for r in stream.draw(2)] == proof.task_indices("new")[:2]
    assert not stream.under_challenge(stream._own_ref("basic_arithmetic"))


def test_datasets_follow_the_catalogue_weights_under_a_challenge():
    catalogue = Catalogue("w", EASY_CATALOGUE.tasks[:2], weights=(9.0, 1.0))
    stream = TaskStream(catalogue, seed=3)
    drawn = []
    for i in range(200):
        stream.follow(f"c{i}")
        drawn += stream.draw(10)
    share = sum(r.dataset == EASY_CATALOGUE.tasks[0].dataset for r in drawn) / len(drawn)
    assert 0.87 < share < 0.93


def test_without_a_challenge_or_with_too_few_questions_left_the_node_draws_its_own():
    plain = [(r.dataset, r.index) for r in TaskStream(EASY_CATALOGUE, seed=5).draw(6)]
    assert [(r.dataset, r.index) for r in TaskStream(EASY_CATALOGUE, seed=5).draw(6)] == plain

    stream = TaskStream(EASY_CATALOGUE, seed=5)
    stream.follow("c")
    stream.draw(proof.QUESTIONS_PER_CHALLENGE - 2)
    rest = stream.draw(4)  # 2 left: not enough for the round
    assert all(r.seed == 5 and not stream.under_challenge(r) for r in rest)


def test_a_challenge_question_that_cannot_be_built_is_skipped_for_the_next_one():
    spec = SAPO_CATALOGUE.get("decimal_arithmetic")
    seed = proof.task_seed(UNBUILDABLE)
    try:
        build_entry(spec, seed, proof.task_index(UNBUILDABLE, 0))
        raise AssertionError("question 0 of the challenge builds")
    except TaskError:
        pass
    stream = TaskStream(Catalogue("d", (spec,)), seed=1)
    stream.follow(UNBUILDABLE)
    questions = sample_questions(stream, 2)

    # Question 0 cannot be built: the drawn ones were j = 0, 1; the redraw is j = 2.
    assert [q.ref.index for q in questions] == [proof.task_index(UNBUILDABLE, j) for j in (2, 1)]
    assert all(stream.under_challenge(q.ref) and q.ref.seed == seed for q in questions)


def test_the_streams_saved_state_resumes_the_same_draws_under_the_same_challenge():
    a = TaskStream(EASY_CATALOGUE, seed=8)
    a.draw(5)
    saved = a.state()
    b = TaskStream(EASY_CATALOGUE, seed=8)
    b.set_state(saved)
    a.follow("c")
    b.follow("c")
    assert a.draw(4) == b.draw(4)
