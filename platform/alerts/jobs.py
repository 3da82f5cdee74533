"""The alerts app's scheduled job (ops.scheduled.JOBS names it)."""

from __future__ import annotations

from alerts.check import alerts_check


def run() -> str:
    return alerts_check().line()
