"""The weights a node commits to before a round (sapo_node.commitments): a safetensors file whose
tensors have the committed digest, kept while a group waits for its verdict or an audit asks for it,
deleted otherwise, and bounded."""

from __future__ import annotations

import logging
import os

import pytest
import torch
from safetensors.torch import load_file

from sapo_node.audit import model_digest
from sapo_node.commitments import CommitmentStore, tensors_digest


class Tied(torch.nn.Module):
    """A language model's shape in small: an embedding tied to the output layer, as SmolLM2's is."""

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(50, 8, dtype=dtype)
        self.norm = torch.nn.LayerNorm(8, dtype=dtype)
        self.head = torch.nn.Linear(8, 50, bias=False, dtype=dtype)
        self.head.weight = self.embed.weight


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_file_holds_every_tensor_of_the_state_dict_under_the_committed_digest(tmp_path, dtype):
    model = Tied(dtype)
    store = CommitmentStore(tmp_path)
    c = store.commit(model)

    assert c is not None and c.written and c.path == tmp_path / f"{c.digest}.safetensors"
    saved = load_file(str(c.path))
    assert set(saved) == set(model.state_dict())  # the tied output layer too
    assert all(torch.equal(saved[k], v) and saved[k].dtype == dtype for k, v in model.state_dict().items())
    assert tensors_digest(saved) == c.digest == model_digest(model)  # what an auditor computes
    assert [p.name for p in tmp_path.iterdir()] == [c.path.name]  # no temporary file left


def test_unchanged_weights_keep_their_file_and_an_update_commits_anew(tmp_path):
    model = Tied()
    store = CommitmentStore(tmp_path)
    first = store.commit(model)
    again = store.commit(model)
    assert again is not None and again.digest == first.digest and not again.written

    with torch.no_grad():
        model.norm.weight.add_(0.5)
    after = store.commit(model, keep={first.digest})
    assert after.digest != first.digest
    assert set(store.files()) == {first.digest, after.digest}


def test_a_file_goes_once_no_group_waits_for_it_and_no_audit_holds_it(tmp_path):
    clock = Clock()
    model = Tied()
    store = CommitmentStore(tmp_path, clock=clock)
    digest = store.commit(model).digest

    assert store.prune(keep={digest}) == [] and store.path(digest) is not None  # its groups wait
    assert store.hold("audit-1", digest, deadline=clock.now + 3600)
    assert store.prune(keep=set()) == []  # acked, but the audit asked for it

    reopened = CommitmentStore(tmp_path, clock=clock)  # a restarted node remembers the audit
    assert reopened.holds() == {"audit-1": (digest, clock.now + 3600)}
    reopened.release("audit-1")  # uploaded
    assert reopened.prune(keep=set()) == [digest] and reopened.path(digest) is None
    assert not reopened.hold("audit-2", digest, deadline=clock.now + 3600)  # gone: nothing to upload


def test_an_audit_holds_its_file_until_its_deadline_and_waiting_groups_until_the_challenge_expires(tmp_path):
    clock = Clock()
    store = CommitmentStore(tmp_path, clock=clock, max_age=86_400)
    model = Tied()
    held = store.commit(model).digest
    store.hold("a", held, deadline=clock.now + 3600)
    with torch.no_grad():
        model.norm.bias.add_(1.0)
    waiting = store.commit(model, keep={held}).digest

    clock.now += 3601
    assert store.prune(keep={waiting}) == [held]
    os.utime(store.path(waiting), (clock.now - 86_401, clock.now - 86_401))
    assert store.prune(keep={waiting}) == [waiting]  # its groups can no longer be audited


def test_past_its_bounds_a_round_commits_nothing_says_so_once_and_commits_again_when_there_is_room(tmp_path, caplog):
    store = CommitmentStore(tmp_path, max_count=2)
    model = Tied()
    kept = []
    for _ in range(2):
        kept.append(store.commit(model, keep=kept).digest)
        with torch.no_grad():
            model.norm.bias.add_(1.0)

    with caplog.at_level(logging.WARNING, logger="sapo_node.commitments"):
        assert store.commit(model, keep=kept) is None
        assert store.commit(model, keep=kept) is None
        assert set(store.files()) == set(kept)
        assert sum("not committed" in r.message for r in caplog.records) == 1
        c = store.commit(model, keep=kept[1:])  # the oldest's groups were acknowledged
        assert c is not None and set(store.files()) == {kept[1], c.digest}
        assert any("committed again" in r.message for r in caplog.records)

    byte_bound = CommitmentStore(tmp_path / "b", max_bytes=c.bytes + 100)
    first = byte_bound.commit(model)
    with torch.no_grad():
        model.norm.bias.add_(1.0)
    assert first is not None and byte_bound.commit(model, keep={first.digest}) is None


def test_only_a_digest_names_a_file(tmp_path):
    store = CommitmentStore(tmp_path)
    (tmp_path / "secret").write_text("x")
    assert store.path("../secret") is None and store.path("A" * 64) is None
    assert not store.hold("a", "../secret", deadline=2e9)
