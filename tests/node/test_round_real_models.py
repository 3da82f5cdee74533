"""Rounds with the built-in warm-started models: rewards come in, groups carry signal, and a node
with another tokenizer (tiny-mini splits digits) learns from the tiny node's shared text."""

from __future__ import annotations

import copy

from sapo_node.config import NodeConfig
from sapo_node.loop import run
from sapo_node.tasks import EASY_CATALOGUE
from sapo_node.transport import MemoryPool, MemoryTransport


def _config(out, **kw) -> NodeConfig:
    base = dict(
        out=str(out), rounds=1, questions=6, generations=4, max_new_tokens=16, checkpoint_every=0, connect_wait=0
    )
    return NodeConfig(**(base | kw))


def test_tiny_and_tiny_mini_swarm(tmp_path, tiny_policy_copy, tiny_cache_dir):
    from sapo_node.tiny.cache import load_tiny

    mini = load_tiny("tiny-mini", cache_dir=tiny_cache_dir, progress=False)
    assert mini[1].get_vocab() != tiny_policy_copy[1].get_vocab()
    pool = MemoryPool(EASY_CATALOGUE)  # serves only groups whose rewards differ, like the platform

    a = run(
        _config(tmp_path / "a", seed=3, local=6, external=0), MemoryTransport(pool, "tiny"), policy=tiny_policy_copy
    )
    row_a = a.metrics[0]
    assert row_a["reward_mean"] > 0 and row_a["local_kept"] >= 1 and row_a["updated"]

    b = run(
        _config(tmp_path / "b", seed=4, local=2, external=2), MemoryTransport(pool, "mini"), policy=copy.deepcopy(mini)
    )
    row_b = b.metrics[0]
    assert row_b["external_offered"] == min(2, row_a["local_kept"]) and row_b["external_invalid"] == 0
    assert row_b["external_kept"] == row_b["external_offered"]  # honest text re-scores to the same, informative rewards
    assert row_b["external_rescored"] == 0
