"""Two nodes with different models and tokenizers train on each other's text (memory transport)."""

from __future__ import annotations

from node_toys import make_policy

from sapo_node.config import NodeConfig
from sapo_node.groups import Group
from sapo_node.loop import run
from sapo_node.tasks import EASY_CATALOGUE, TaskRef, build_entry
from sapo_node.transport import MemoryPool, MemoryTransport


def _config(out, **kw) -> NodeConfig:
    base = dict(
        out=str(out), rounds=1, questions=2, generations=2, max_new_tokens=6, checkpoint_every=0, connect_wait=0
    )
    return NodeConfig(**(base | kw))


def test_two_nodes_with_different_tokenizers_exchange_groups(tmp_path):
    pool = MemoryPool(EASY_CATALOGUE, only_informative=False)
    policy_a, policy_b = make_policy("a"), make_policy("b")
    assert policy_a[1].get_vocab() != policy_b[1].get_vocab()

    # Node A shares its round; a third node's group with right and wrong answers is in the pool too.
    result_a = run(_config(tmp_path / "a", seed=1, local=2, external=0), MemoryTransport(pool, "a"), policy=policy_a)
    assert result_a.metrics[0]["accepted"] == 2
    spec = EASY_CATALOGUE.get("basic_arithmetic")
    entry = build_entry(spec, 9, 4)
    right, wrong = f" <answer>{entry['answer']}</answer>", " <answer>-1</answer>"
    pool.add(
        "c",
        [
            Group.new(
                round=1,
                task=TaskRef("basic_arithmetic", 9, 4),
                question=entry["question"],
                answer=entry["answer"],
                completions=[right, wrong, right],
                rewards=[0.0, 1.0, 0.0],
            )
        ],
    )

    # Node B (another tokenizer) takes all three external groups, re-scores and re-tokenises them.
    transport_b = MemoryTransport(pool, "b")
    result_b = run(_config(tmp_path / "b", seed=2, local=2, external=3), transport_b, policy=policy_b)
    row = result_b.metrics[0]
    assert row["external_offered"] == 3 and row["external_invalid"] == 0
    assert row["external_kept"] >= 1  # at least the third node's group carries a signal
    assert row["external_rescored"] >= 3  # its claimed rewards were wrong; B trusted its own verifier
    assert row["updated"]
    (node, report) = pool.reports[-1]
    assert node == "b" and len(report["used"]) == row["local_kept"] + row["external_kept"]
    # each report says the node's arm: its configured I and J (A trained in silo)
    assert (report["local"], report["external"]) == (2, 3)
    assert [(r["local"], r["external"]) for n, r in pool.reports if n == "a"] == [(2, 0)]


def test_an_adaptive_node_gives_its_uninformative_slots_to_the_swarm(tmp_path):
    pool = MemoryPool(EASY_CATALOGUE, only_informative=False)
    spec = EASY_CATALOGUE.get("basic_arithmetic")
    for index in range(3):
        entry = build_entry(spec, 9, index)
        right, wrong = f" <answer>{entry['answer']}</answer>", " <answer>-1</answer>"
        pool.add(
            "c",
            [
                Group.new(
                    round=1,
                    task=TaskRef("basic_arithmetic", 9, index),
                    question=entry["question"],
                    answer=entry["answer"],
                    completions=[right, wrong],
                    rewards=[1.0, 0.0],
                )
            ],
        )
    # An untrained toy model scores 0 on all its own questions: none of its own groups is informative.
    config = _config(tmp_path / "b", seed=2, local=0, external=2, ratio="adaptive")
    row = run(config, MemoryTransport(pool, "b"), policy=make_policy("b")).metrics[0]
    assert row["reward_mean"] == 0.0
    assert (row["local_kept"], row["external_kept"]) == (0, 2)
