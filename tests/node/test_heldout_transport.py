"""The WebSocket transport's side of held-out checks (sapo_node.transport.websocket): a check frame is
kept for the loop (a newer one replaces it), one outside the protocol's bounds is ignored, the answers
go out as one `heldout_answers` frame, and a new socket drops what belonged to the old one."""

from __future__ import annotations

import time
import uuid

from sapo_node import protocol
from sapo_node.transport.websocket import WebSocketTransport


def _frame(questions: int = 2, tokens: int = 32) -> dict:
    return {
        "type": protocol.HELDOUT_CHECK,
        "v": 1,
        "check": str(uuid.uuid4()),
        "questions": [{"id": i, "dataset": "basic_arithmetic", "question": f"{i} + 1 = ?"} for i in range(questions)],
        "max_new_tokens": tokens,
        "deadline": time.time() + 60,
    }


def test_a_check_is_kept_for_the_loop_answered_once_and_dropped_with_its_socket(tmp_path):
    t = WebSocketTransport("ws://127.0.0.1:9/ws/node/", "token", tmp_path / "outbox.sqlite3")
    try:
        for bad in (_frame(questions=0), _frame(questions=protocol.HELDOUT_MAX_QUESTIONS + 1), _frame(tokens=0)):
            t._ON_SERVER_MESSAGE[protocol.HELDOUT_CHECK](t, bad)
        t._ON_SERVER_MESSAGE[protocol.HELDOUT_CHECK](t, {**_frame(), "check": "not a uuid"})
        assert t.heldout_check() is None  # none of them was a check

        first, second = _frame(), _frame()
        t._ON_SERVER_MESSAGE[protocol.HELDOUT_CHECK](t, first)
        t._ON_SERVER_MESSAGE[protocol.HELDOUT_CHECK](t, second)
        check = t.heldout_check()
        assert str(check.check) == second["check"] and [q.id for q in check.questions] == [0, 1]
        assert t.heldout_check() is None  # taken once
        t.answer_heldout(check, round=7, texts=["a", "b"])
        (sent,) = t._heldout_answers
        assert sent == protocol.frame(
            protocol.HELDOUT_ANSWERS,
            check=second["check"],
            round=7,
            answers=[{"id": 0, "text": "a"}, {"id": 1, "text": "b"}],
        )

        t._ON_SERVER_MESSAGE[protocol.HELDOUT_CHECK](t, _frame())
        t._forget_heldout()  # what a new socket's session does first
        assert t.heldout_check() is None and not t._heldout_answers
    finally:
        t.close()
