"""The node's answers to a held-out check (sapo_node.heldout_check): greedy, with the node's prompt, the
same texts the held-out evaluation of the export and the studies writes for the same questions; bounded
by the server's and the node's token counts; a check past its deadline is not answered."""

from __future__ import annotations

import time
import uuid

from research.heldout import evaluate_policy
from sapo_node import protocol
from sapo_node.heldout_check import answer_check, answer_pending_check
from sapo_node.tasks import EASY_CATALOGUE, Catalogue, build_entries, score_completion
from sapo_node.transport import SiloTransport


def _check(questions: list[tuple[str, str]], *, tokens: int = 24, deadline: float | None = None):
    return protocol.WireHeldoutCheck(
        check=uuid.uuid4(),
        questions=[protocol.WireHeldoutQuestion(id=i, dataset=d, question=q) for i, (d, q) in enumerate(questions)],
        max_new_tokens=tokens,
        deadline=time.time() + 60 if deadline is None else deadline,
    )


class Holding(SiloTransport):
    """A transport holding one check, recording the answers sent (the loop's side of the interface)."""

    def __init__(self, check):
        self.check, self.sent = check, []

    def heldout_check(self):
        check, self.check = self.check, None
        return check

    def answer_heldout(self, check, *, round, texts):
        self.sent.append((check.check, round, texts))


def test_a_check_is_answered_as_the_held_out_evaluation_answers_it(tiny_mini_policy):
    model, tokenizer = tiny_mini_policy
    spec = EASY_CATALOGUE.get("calendar_arithmetic")
    entries = build_entries(spec, protocol.HELDOUT_SEED, 8)  # the evaluation's questions 0..7
    check = _check([(spec.dataset, e["question"]) for e in entries], tokens=64)
    texts = answer_check(model, tokenizer, check, max_new_tokens=24)  # the node's own bound is the lower
    assert answer_check(model, tokenizer, check, max_new_tokens=24) == texts  # greedy: the same again
    scores = [score_completion(spec, protocol.HELDOUT_SEED, e, t) for e, t in zip(entries, texts, strict=True)]
    # The study's and the export's held-out evaluation of the same policy on the same questions.
    evaluation = evaluate_policy(model, tokenizer, Catalogue(name="one", tasks=(spec,)), n=8, max_new_tokens=24)
    assert sum(scores) / 8 == evaluation[spec.dataset]["accuracy"]
    assert sum(scores) > 0  # the warm-started tiny-mini gets some right: the answers are scored, not noise


def test_the_server_bounds_the_answers_length(tiny_mini_policy):
    model, tokenizer = tiny_mini_policy
    spec = EASY_CATALOGUE.get("basic_arithmetic")
    (entry,) = build_entries(spec, protocol.HELDOUT_SEED, 1)
    short = answer_check(model, tokenizer, _check([(spec.dataset, entry["question"])], tokens=1), max_new_tokens=64)
    assert len(tokenizer(short[0], add_special_tokens=False)["input_ids"]) <= 1


def test_the_loop_answers_a_pending_check_once_and_not_past_its_deadline(tiny_mini_policy):
    model, tokenizer = tiny_mini_policy
    spec = EASY_CATALOGUE.get("basic_arithmetic")
    questions = [(spec.dataset, e["question"]) for e in build_entries(spec, protocol.HELDOUT_SEED, 2)]
    transport = Holding(_check(questions))
    assert answer_pending_check(model, tokenizer, transport, round=5, max_new_tokens=16)
    ((_, round_, texts),) = transport.sent
    assert round_ == 5 and len(texts) == 2
    assert not answer_pending_check(model, tokenizer, transport, round=6, max_new_tokens=16)  # taken once
    late = Holding(_check(questions, deadline=time.time() - 1))
    assert not answer_pending_check(model, tokenizer, late, round=7, max_new_tokens=16) and not late.sent
