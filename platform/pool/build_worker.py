"""The work a bounded worker process does for pool.builds: verify a share's groups of one dataset that
is costly to build, with the dataset built in the worker (sapo_node.entry_check.run_bounded), so the
server's process never holds it.

Imported by the worker by name, with the caller's path: no Django, nothing of the database.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from pool.records import RolloutIn
from pool.verification import Verification, entry_rebuilt, verify_entry
from sapo_node.datasets import TaskSpec, dataset_for
from sapo_node.tasks import score_completions
from sapo_node.verifiers import scored_in_process


def groups_verified(spec: TaskSpec, rollouts: list[RolloutIn]) -> list[Verification | dict[str, Any]]:
    """Each group's verdict against `spec`'s dataset of its seed (pool.verification), in order; a group
    whose answers are scored in the sandbox (a dataset outside the reviewed scorers) gets its rebuilt
    entry instead, for the caller to score: a worker process cannot start the sandbox's own."""
    out: list[Verification | dict[str, Any]] = []
    for rollout in rollouts:
        entry = entry_rebuilt(spec, rollout)
        if isinstance(entry, Verification):
            out.append(entry)
        elif scored_in_process(spec.dataset, dataset_for(spec, rollout.seed)):
            # The answers taken in Python (extract_answer): the C twin's are the same
            # (tests/platform/test_native.py), and the worker reads no settings to choose.
            score = partial(score_completions, spec, rollout.seed, entry)
            out.append(verify_entry(rollout, entry, score))
        else:
            out.append(entry)
    return out
