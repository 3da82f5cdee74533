"""A round under a server challenge (docs/protocol.md, "Proof of work"): its questions are the
challenge's, its weights are committed before generation, and each group carries the proof an audit
replays; a round without a challenge sends none and keeps nothing."""

from __future__ import annotations

import torch
from node_toys import make_policy
from safetensors.torch import load_file

from sapo_node import proof
from sapo_node.audit import model_digest, replay_groups
from sapo_node.commitments import FOLDER, tensors_digest
from sapo_node.config import NodeConfig
from sapo_node.generate import encode_prompt
from sapo_node.groups import Group
from sapo_node.loop import play_round, start_node
from sapo_node.prompts import format_prompt
from sapo_node.tasks import EASY_CATALOGUE
from sapo_node.transport import MemoryPool, MemoryTransport

CHALLENGE = "c1.test.1700000000000.00112233445566aa.0123456789abcdef0123456789abcdef"


def _node(tmp_path, pool, **kw):
    config = NodeConfig(
        out=str(tmp_path),
        rounds=2,
        questions=3,
        generations=2,
        max_new_tokens=6,
        checkpoint_every=0,
        connect_wait=0,
        model="toy-a",
        **kw,
    )
    return start_node(config, MemoryTransport(pool, "a"), policy=make_policy("a"))


def test_a_round_under_a_challenge_commits_its_weights_and_proves_each_group(tmp_path):
    pool = MemoryPool(EASY_CATALOGUE, only_informative=False, challenge=CHALLENGE)
    node = _node(tmp_path, pool)
    before = {k: v.clone() for k, v in node.model.state_dict().items()}
    row = play_round(node)
    groups = [g for _, g in sorted(pool.groups.values(), key=lambda item: item[1].id)]

    assert len(groups) == 3 and "commit" in row["seconds"]
    seed, indices = proof.task_seed(CHALLENGE), proof.task_indices(CHALLENGE)[:3]
    assert sorted(g.task.index for g in groups) == sorted(indices) and {g.task.seed for g in groups} == {seed}
    (weights,) = {g.proof.weights for g in groups}
    committed = load_file(str(tmp_path / FOLDER / f"{weights}.safetensors"))
    # The file is the weights that generated the round (the update came after), under the digest.
    assert tensors_digest(committed) == weights and tensors_digest(before) == weights
    generating = make_policy("a")[0]
    generating.load_state_dict(before)
    assert model_digest(generating) == weights  # the auditor's digest of the same weights
    for group in groups:
        p = group.proof
        assert (p.challenge, p.model, p.temperature) == (CHALLENGE, "toy-a", node.config.temperature)
        assert len(p.tokens) == len(p.logprobs) == len(group.completions) == 2
        ids = [proof.decode_ids(t) for t in p.tokens]
        lps = [proof.decode_floats(x) for x in p.logprobs]
        assert [len(i) for i in ids] == [len(x) for x in lps] and all(x <= 0 for lp in lps for x in lp)
        text = [node.tokenizer.decode(i, skip_special_tokens=True) for i in ids]
        assert text == group.completions
        assert Group.from_wire(group.to_wire() | {"node": "a"}).proof == p  # as a sample carries it

    # An auditor holding only the committed file replays every token of every completion.
    auditor, tokenizer = make_policy("a")
    auditor.load_state_dict(committed)
    for group in groups:
        t = group.task
        keys = [proof.completion_key(CHALLENGE, t.dataset, t.seed, t.index, k) for k in range(2)]
        prompt_ids = encode_prompt(tokenizer, format_prompt(tokenizer, group.question))
        replays = replay_groups(
            auditor,
            tokenizer,
            prompt_ids,
            [proof.decode_ids(x) for x in group.proof.tokens],
            keys,
            group.proof.temperature,
            logprobs=[proof.decode_floats(x) for x in group.proof.logprobs],
        )
        assert all(r.passed for r in replays), replays

    # The pool acknowledged the round at once and asked for no audit: the next round, with other
    # weights (as an update with a signal leaves them), drops the file.
    with torch.no_grad():
        next(node.model.parameters()).view(-1)[0] += 1.0
    play_round(node)
    kept = {p.stem for p in (tmp_path / FOLDER).glob("*.safetensors")}
    assert weights not in kept and len(kept) == 1


def test_a_round_without_a_challenge_proves_nothing_and_keeps_nothing(tmp_path):
    pool = MemoryPool(EASY_CATALOGUE, only_informative=False)
    node = _node(tmp_path, pool, seed=4)
    play_round(node)
    assert all(g.proof is None and g.task.seed == 4 for _, g in pool.groups.values())
    assert not list((tmp_path / FOLDER).glob("*.safetensors"))
