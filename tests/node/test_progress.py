"""Progress output: live bars on a terminal, plain lines in pipes and logs (sapo_node.progress)."""

import io
import os

from sapo_node import progress
from sapo_node.progress import LineProgress, progress_bar


def test_a_pipe_gets_plain_lines_at_start_and_end_not_a_redraw_per_step():
    out = io.StringIO()
    total = 0
    for step in progress_bar(range(200), desc="warm start tiny", unit="step", file=out, leave=False):
        total += step
    text = out.getvalue()
    assert total == sum(range(200))
    assert "\r" not in text and "\x1b" not in text
    lines = text.splitlines()
    assert lines[0] == "warm start tiny: 0/200 step (0 s)"
    assert lines[-1].startswith("warm start tiny: 200/200 step (")
    assert len(lines) == 2  # the loop took far less than LINE_EVERY seconds


def test_lines_are_spaced_by_every_seconds_and_carry_the_postfix(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    with progress_bar(total=30, desc="sharing", unit="msg", file=out, every=10) as bar:
        for _ in range(30):
            clock[0] += 1.0
            bar.set_postfix(accepted=7)
            bar.update(1)
    lines = out.getvalue().splitlines()
    # start, then one line per 10 s of work (after steps 10, 20 and 30); the end adds none
    assert [line.split(" (")[0] for line in lines] == [
        "sharing: 0/30 msg",
        "sharing: 10/30 msg",
        "sharing: 20/30 msg",
        "sharing: 30/30 msg",
    ]
    assert lines[-1] == "sharing: 30/30 msg (30 s, 1 msg/s) accepted=7"


def test_a_line_with_a_total_says_the_time_left_and_amounts_to_one_decimal(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    with progress_bar(total=3.7, desc="downloading tiny-mini", unit="MB", file=out, every=10) as bar:
        for _ in range(37):
            clock[0] += 1.0
            bar.update(0.1)
    lines = out.getvalue().splitlines()
    assert lines[0] == "downloading tiny-mini: 0/3.7 MB (0 s)"
    assert lines[1] == "downloading tiny-mini: 1.0/3.7 MB (10 s, 0.1 MB/s, ETA 27 s)"
    assert lines[-1] == "downloading tiny-mini: 3.7/3.7 MB (37 s, 0.1 MB/s)"


def test_a_terminal_gets_a_live_bar():
    leader, follower = os.openpty()
    with os.fdopen(follower, "w") as tty:
        bar = progress_bar(total=3, desc="rounds", file=tty, dynamic_ncols=False, ncols=80)  # a new pty is 0 wide
        assert not isinstance(bar, LineProgress)
        bar.update(3)
        bar.close()
        tty.flush()
        written = _read_all(leader)
    os.close(leader)
    assert "\r" in written and "3/3" in written


def _read_all(fd: int) -> str:
    """Everything written to a pty so far: one read() may return only the first chunk."""
    import select

    chunks = []
    while select.select([fd], [], [], 0.5)[0]:
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode()


def test_disabled_writes_nothing():
    out = io.StringIO()
    bar = progress_bar(range(5), desc="quiet", file=out, disable=True)
    assert list(bar) == [0, 1, 2, 3, 4]
    assert out.getvalue() == ""


def test_a_round_line_counts_the_groups_the_node_refused_itself_apart_from_the_pools_rejections(capsys):
    from sapo_node.progress import RoundProgress

    row = {
        "round": 3,
        "reward_mean": 0.25,
        "local_kept": 4,
        "external_kept": 2,
        "accepted": 5,
        "rejected": 1,
        "refused": 56,
        "tokens_per_s": 900.0,
        "connection": "connected",
        "seconds": {"total": 2.5},
    }
    bar = RoundProgress(1, 10, enabled=False)
    bar.done(row)
    bar.done({**row, "round": 4, "refused": 0})
    bar.close()
    first, second = capsys.readouterr().out.splitlines()
    assert "shares=5ok/1rej" in first and "refused_locally=56" in first
    assert "shares=5ok/1rej" in second and "refused_locally" not in second  # nothing to say


def test_a_bar_without_a_last_round_reads_round_and_phase_not_a_count(capsys):
    from sapo_node.progress import RoundProgress

    bar = RoundProgress(11, 0, enabled=True)  # --rounds 0: until stopped, so no total
    bar.phase(11, "generate")
    bar.bar.refresh()
    bar.close()
    err = capsys.readouterr().err
    assert "round 11: generate" in err
    assert "generate:" not in err and "round [" not in err and "10round" not in err


def test_a_pipe_gets_a_line_per_long_phase_and_a_round_line_with_its_phases_and_eta(monkeypatch, capsys):
    from sapo_node import progress
    from sapo_node.progress import RoundProgress

    clock = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    bar = RoundProgress(3, 5, enabled=False)
    for phase, seconds in [("sample", 0.01), ("generate", 4.2), ("score", 0.1), ("share", 0.0), ("update", 1.5)]:
        bar.phase(3, phase)
        clock[0] += seconds
    row = {
        "round": 3,
        "reward_mean": 0.25,
        "local_kept": 4,
        "external_kept": 2,
        "accepted": 5,
        "rejected": 1,
        "tokens_per_s": 900.0,
        "connection": "connected",
        "seconds": {"sample": 0.01, "generate": 4.2, "score": 0.1, "share": 0.0, "update": 1.5, "total": 5.81},
    }
    bar.done(row)
    bar.close()
    lines = capsys.readouterr().out.splitlines()
    # a phase of a second or more gets its own line when it ends: a real model's round is not silent
    assert lines[:2] == ["round 3: generate 4.2 s", "round 3: update 1.5 s"]
    assert len(lines) == 3
    assert lines[2].startswith("round 3/5: reward=0.250 kept=4+2 shares=5ok/1rej")
    assert "round 5.8 s (sample 0.0 s, generate 4.2 s, score 0.1 s, share 0.0 s, update 1.5 s)" in lines[2]
    assert lines[2].endswith("ETA 12 s")  # two rounds left at 5.8 s each
