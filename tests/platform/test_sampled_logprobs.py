"""The sharer's log-probabilities over a real socket: a group shared with its proof is sampled by another
node, whose assemble matches the proof's tokens to its own tokenisation of the texts, and whose update
weighs the completions by them (docs/node.md, "Corrected and gated sharing")."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from channels.db import database_sync_to_async as sync_to_async
from factories import make_node_with_token
from node_sockets import ask, open_socket
from support.pool import SAPO, challenged_group, share_frame

from sapo_node import proof
from sapo_node.assemble import assemble
from sapo_node.groups import ExternalRules, Group
from sapo_node.grpo import grpo_update
from sapo_node.prompts import format_prompt

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_rate_counts")]


async def test_a_sampled_groups_logprobs_reach_the_correcting_nodes_update(node_token, tiny_mini_policy):
    model, tok = tiny_mini_policy
    socket = await open_socket(node_token)
    welcome = await ask(socket, {"type": "hello", "v": 1, "ref": "h"})
    group = challenged_group(welcome["challenge"])
    ids = [tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for text in group["completions"]]
    logprobs = [[-(1 + t % 4) / 8 for t in range(len(row))] for row in ids]  # exact in float32
    group["proof"].update(
        tokens=[proof.encode_ids(row) for row in ids], logprobs=[proof.encode_floats(row) for row in logprobs]
    )
    assert (await ask(socket, share_frame(group)))["accepted"] == [group["id"]]

    _, reader_token = await sync_to_async(make_node_with_token)(name="reader")
    reader = await open_socket(reader_token)
    reply = await ask(reader, {"type": "sample", "v": 1, "n": 4})
    (sampled,) = [Group.from_wire(r) for r in reply["rollouts"] if r["id"] == group["id"]]
    train, stats = assemble(
        [],
        [sampled],
        n_local=0,
        n_external=1,
        rng=random.Random(0),
        catalogue=SAPO,
        tokenizer=tok,
        format_prompt=format_prompt,
        max_tokens=64,
        rules=ExternalRules(model="tiny-mini", use_logprobs=True),
    )
    (tg,) = train
    assert stats.external_corrected == 1
    assert tg.sharer_logprobs == [row[:-1] for row in logprobs]  # this node's tokens: the texts', no stop token

    policy = copy.deepcopy(model)
    update = grpo_update(
        policy,
        torch.optim.AdamW(policy.parameters(), lr=1e-4),
        train,
        pad_id=tok.pad_token_id,
        correction="token",
        correction_cap=2.0,
    )
    assert update.corrected == 4 and 0 < update.correction_weight <= 2.0
    await socket.disconnect()
    await reader.disconnect()
