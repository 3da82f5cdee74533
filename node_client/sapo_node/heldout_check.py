"""Answering the server's held-out checks (docs/protocol.md, "heldout_check"): between two rounds, the
node answers the few questions of a check greedily with its current policy, with the prompt it trains
with, and sends the texts back; the server scores them with the swarm's verifiers. The same greedy
evaluation as the export's card and the studies' held-out accuracy (the node's own sampler at
temperature 0, which the tiny package's generate_texts wraps), on questions the server chose from its
held-out stream.

A check costs at most protocol.HELDOUT_MAX_QUESTIONS answers of at most the lower of the server's and
the node's own max_new_tokens: a fraction of a round's G completions per question. One past its deadline
is not answered (the server would refuse it as heldout_late)."""

from __future__ import annotations

import time
from typing import Any

from sapo_node import protocol
from sapo_node.generate import generate_groups
from sapo_node.prompts import format_prompt
from sapo_node.transport import Transport


def answer_check(model: Any, tokenizer: Any, check: protocol.WireHeldoutCheck, *, max_new_tokens: int) -> list[str]:
    """The policy's greedy answer to each question of `check`, in its order."""
    prompts = [format_prompt(tokenizer, q.question) for q in check.questions]
    tokens = max(1, min(check.max_new_tokens, max_new_tokens))
    groups = generate_groups(model, tokenizer, prompts, generations=1, max_new_tokens=tokens, temperature=0.0)
    return [group.texts[0] for group in groups]


def answer_pending_check(model: Any, tokenizer: Any, transport: Transport, *, round: int, max_new_tokens: int) -> bool:
    """Answer the check the transport holds, if any and still due; True when answers went."""
    check = transport.heldout_check()
    if check is None or time.time() >= check.deadline:
        return False
    texts = answer_check(model, tokenizer, check, max_new_tokens=max_new_tokens)
    transport.answer_heldout(check, round=round, texts=texts)
    return True
