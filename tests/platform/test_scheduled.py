"""The scheduled command runs every job of ops.scheduled.JOBS, and one failing job does not stop the rest."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from ops import scheduled

pytestmark = pytest.mark.django_db


def test_every_job_is_importable_and_runs(capsys, settings, tmp_path):
    settings.SAPO_STATS_EXPORT_DIR = tmp_path  # the export job writes files
    call_command("sapo_scheduled")
    out = capsys.readouterr().out
    for name, _ in scheduled.JOBS:
        assert f"{name}: ok" in out


def test_a_failing_job_is_reported_and_the_others_still_run(monkeypatch, capsys):
    ran = []

    def boom() -> str:
        raise RuntimeError("disk full")

    def fine() -> str:
        ran.append("fine")
        return "done"

    monkeypatch.setattr(scheduled, "JOBS", [("boom", "m.boom"), ("fine", "m.fine")])
    monkeypatch.setattr(scheduled, "job_function", {"m.boom": boom, "m.fine": fine}.__getitem__)
    with pytest.raises(CommandError, match="some scheduled jobs failed"):
        call_command("sapo_scheduled")
    out = capsys.readouterr().out
    assert "boom: FAILED" in out and "RuntimeError: disk full" in out
    assert ran == ["fine"] and "fine: ok" in out


def test_unknown_job_names_are_refused():
    with pytest.raises(ValueError, match="unknown jobs"):
        scheduled.run_jobs(["nope"])
