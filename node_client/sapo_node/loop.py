"""The node's training loop: SAPO's Algorithm 1, one round after another, read top to bottom.

    sample -> (commit) -> generate -> score -> share -> assemble -> update -> report and log

Each step is a function in a module named for it. The loop never waits on the network: sharing
appends to a durable outbox and external groups are whatever has already arrived. Ctrl-C (or
SIGTERM) finishes the current step, saves a checkpoint and returns; `--resume` continues.

A pause (the node's owner on the site, or its idle policy: sapo_node.pause, sapo_node.idle) is waited
out at a round's start and between generating and sharing: the step in progress finishes, nothing is
lost, and the round goes on after.

`run` is start_node -> play_round ... -> finish_node; a driver that interleaves several nodes in
one process (the experiment) calls those three itself.
"""

from __future__ import annotations

import copy
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from sapo_node import __version__, proof, protocol
from sapo_node.assemble import assemble
from sapo_node.baseline import OwnBaseline
from sapo_node.checkpoint import TrainingState, latest_checkpoint, read_checkpoint, restore_checkpoint, save_checkpoint
from sapo_node.commitments import FOLDER, Commitment, CommitmentStore
from sapo_node.config import NodeConfig
from sapo_node.generate import Generated, generate_groups, pad_id, random_keys
from sapo_node.groups import ExternalRules, Group, make_proof
from sapo_node.grpo import grpo_update, make_optimizer
from sapo_node.heldout_check import answer_pending_check
from sapo_node.idle import IdleMonitor, start_idle_policy
from sapo_node.metrics import MetricsLog, PhaseTimer, round_metrics, round_report
from sapo_node.models import describe_hardware, load_policy, resolve_device
from sapo_node.pause import PauseGate, pause_line
from sapo_node.preparing import telling_preparing
from sapo_node.progress import RoundProgress
from sapo_node.prompts import format_prompt
from sapo_node.ratio import AdaptiveRatio
from sapo_node.sample import Question, sample_questions
from sapo_node.score import score_rollouts
from sapo_node.share import share_groups
from sapo_node.tasks import CATALOGUES, Catalogue, TaskStream
from sapo_node.transport import Hello, SiloTransport, Transport, TransportCounts, make_transport


@dataclass
class RunResult:
    out: Path
    #: The last round completed (and checkpointed).
    last_round: int
    #: True when Ctrl-C/SIGTERM stopped the run before its last round.
    interrupted: bool
    metrics: list[dict[str, Any]] = field(default_factory=list)
    #: Seconds from the first round to the end of the closing flush (loading the model not counted).
    seconds: float = 0.0
    #: The verdicts on this node's shares when the run ended; None for an offline run.
    shares: TransportCounts | None = None


def run(config: NodeConfig, transport: Transport | None = None, *, policy: tuple[Any, Any] | None = None) -> RunResult:
    """Run rounds until `config.rounds` (0: until stopped). `policy` = (model, tokenizer) skips loading."""
    node = start_node(config, transport, policy=policy)
    started = time.monotonic()
    result = RunResult(node.out, node.last_round, interrupted=False)
    progress = RoundProgress(node.last_round + 1, node.config.rounds)
    with stop_on_signals() as stop:
        try:
            while not stop.requested and (node.config.rounds == 0 or node.last_round < node.config.rounds):
                row = play_round(node, stop=stop, on_phase=progress.phase)
                if row is None:
                    break  # stopped mid-round: the round is dropped, the last complete one is saved below
                result.metrics.append(row)
                progress.done(row)
        finally:
            progress.close()
            result.shares = finish_node(node)
    result.last_round, result.interrupted = node.last_round, stop.requested
    result.seconds = time.monotonic() - started
    return result


@dataclass
class Node:
    """Everything one node holds between rounds."""

    config: NodeConfig
    out: Path
    model: Any
    tokenizer: Any
    optimizer: torch.optim.Optimizer
    #: The frozen initial policy, only when kl_coef > 0.
    reference: Any
    transport: Transport
    state: TrainingState
    metrics_log: MetricsLog
    last_round: int = 0
    last_saved: int = 0
    owns_transport: bool = False
    #: The adaptive local/external policy (config.ratio == "adaptive"), else None.
    ratio: AdaptiveRatio | None = None
    #: This node's reward per dataset, when external groups are judged against it (external_baseline == "own").
    baseline: OwnBaseline | None = None
    #: The weights its groups were generated with, kept for audits (None in silo: no server audits it).
    commitments: CommitmentStore | None = None
    #: Why the node must not work now (the site's pause, ...): waited on at the loop's boundaries.
    gate: PauseGate = field(default_factory=PauseGate)
    #: The idle policy's monitor (--pause-when-busy, --pause-on-battery), holding `gate`; None without one.
    idle: IdleMonitor | None = None
    #: Gives a proof (its log-probabilities) to each group a round made without a server challenge; None:
    #: such groups go without one. The experiment's nodes, whose paired question streams ignore the
    #: challenge, set it (research.swarm.LogprobProofs, in the repository checkout).
    prove_unchallenged: Callable[[list[tuple[Group, Generated]]], None] | None = None


def start_node(
    config: NodeConfig, transport: Transport | None = None, *, policy: tuple[Any, Any] | None = None
) -> Node:
    """Resolve and save the config, load the policy, say hello to the swarm, resume if asked."""
    config = config.resolved()
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    config.save(out / "config.json")
    # The choices that matter were printed in one line (machine.describe_fit); the rest is on disk.
    print(f"sapo-node {__version__}: every setting in {out / 'config.json'}", flush=True)

    if config.threads:
        torch.set_num_threads(config.threads)
    seed_everything(config.seed)
    # Read (and check) the checkpoint before saying hello: one that cannot be read safely stops here.
    found = latest_checkpoint(out) if config.resume else None
    device = next(policy[0].parameters()).device if policy is not None else resolve_device(config.device)
    checkpoint = read_checkpoint(found, device) if found is not None else None

    # ---- the swarm: say hello before the model loads, so the site shows the node preparing meanwhile
    owns_transport = transport is None
    transport = transport if transport is not None else make_transport(config, out)
    gate = PauseGate()
    transport.attach_gate(gate)
    transport.start(
        Hello(
            f"sapo-node/{__version__}",
            config.model,
            describe_hardware(config.device),
            config.local,
            config.external,
            swarm=config.swarm,
            heldout=not config.no_heldout_check,
        )
    )

    # ---- the policy, its optimizer, and (only with a KL penalty) the frozen initial policy
    try:
        with telling_preparing(transport):
            model, tokenizer = policy if policy is not None else load_model(config)
            reference = None
            if config.kl_coef:  # the initial policy, frozen (a resumed run reloads it, not the checkpoint)
                reference = copy.deepcopy(model) if policy is not None else load_model(config)[0]
                reference.requires_grad_(False)
    except BaseException as exc:
        if owns_transport:
            transport.close()
        if isinstance(exc, KeyboardInterrupt):
            print(f"stopped while preparing {config.model}; the same command prepares it again", file=sys.stderr)
        raise
    optimizer = make_optimizer(model, lr=config.lr, weight_decay=config.weight_decay)
    idle = start_idle_policy(gate, busy_load=config.pause_when_busy, battery=config.pause_on_battery)
    commitments = None
    if not isinstance(transport, SiloTransport):
        commitments = CommitmentStore(out / FOLDER, base=config.model)  # audits get differences from its base
        transport.answer_audits(commitments)
    stream = TaskStream(starting_catalogue(transport, config), config.seed)
    state = TrainingState(model, optimizer, stream, random.Random(config.seed + 1))

    last = 0
    if config.resume:
        if checkpoint is not None:
            last = restore_checkpoint(checkpoint, state)
        print(
            f"resumed from {found} (round {last})" if found else f"no checkpoint in {out}: starting at round 1",
            flush=True,
        )
    return Node(
        config,
        out,
        model,
        tokenizer,
        optimizer,
        reference,
        transport,
        state,
        MetricsLog(out / "metrics.jsonl"),
        last_round=last,
        last_saved=last,
        owns_transport=owns_transport,
        ratio=AdaptiveRatio(config.local + config.external, config.external) if config.ratio == "adaptive" else None,
        baseline=OwnBaseline() if config.external_baseline == "own" else None,
        commitments=commitments,
        gate=gate,
        idle=idle,
    )


def play_round(
    node: Node, *, stop: StopFlag | None = None, on_phase: Callable[[int, str], None] | None = None
) -> dict[str, Any] | None:
    """One round of SAPO's Algorithm 1. Returns its metrics, or None when `stop` came during generation."""
    config, model, tokenizer, transport, stream = (
        node.config,
        node.model,
        node.tokenizer,
        node.transport,
        node.state.stream,
    )
    n = node.last_round + 1
    if not wait_while_paused(node, stop):
        return None
    timer = PhaseTimer(on_enter=(lambda phase: on_phase(n, phase)) if on_phase else None)
    follow_swarm_catalogue(stream, transport)
    stream.follow(transport.challenge())

    with timer("sample"):
        questions = sample_questions(stream, config.questions)
    # The digest and the file of the weights overlap generation, which changes no weight.
    committing = begin_commitment(node.commitments, model, transport, questions, stream)
    with timer("generate"):
        prompts = [format_prompt(tokenizer, q.question) for q in questions]
        generated = generate_groups(
            model,
            tokenizer,
            prompts,
            generations=config.generations,
            max_new_tokens=config.max_new_tokens,
            temperature=config.temperature,
            batch_size=config.generate_batch,
            keys=sampling_keys(questions, stream, config.generations, committed=committing is not None),
        )
    with timer("commit"):  # what generation did not hide of it; taken before the update changes the weights
        commitment = committing.result() if committing is not None else None
    if (stop is not None and stop.requested) or not wait_while_paused(node, stop):
        return None
    with timer("score"):
        own = score_rollouts(n, questions, generated)
        if commitment is not None:
            attach_proofs(own, questions, stream, commitment, config)
        if node.prove_unchallenged is not None:
            node.prove_unchallenged(own)
    with timer("share"):
        share_groups(transport, [group for group, _ in own])
    with timer("assemble"):
        n_local, n_external = config.local, config.external
        if node.ratio is not None:
            n_local, n_external = node.ratio.choose([group for group, _ in own])
        received = transport.take_external(config.external)
        if node.baseline is not None:  # this round's own rewards count: round 1 has a baseline too
            node.baseline.observe([group for group, _ in own])
        train_set, assembled = assemble(
            own,
            received,
            n_local=n_local,
            n_external=n_external,
            rng=node.state.rng,
            catalogue=stream.catalogue,
            tokenizer=tokenizer,
            format_prompt=format_prompt,
            max_tokens=2 * config.max_new_tokens,
            baseline=node.baseline,
            rules=external_rules(config),
        )
    with timer("update"):
        update = grpo_update(
            model,
            node.optimizer,
            train_set,
            pad_id=pad_id(tokenizer),
            epochs=config.epochs,
            micro_batch=config.micro_batch,
            eps_low=config.eps_low,
            eps_high=config.eps_high,
            kl_coef=config.kl_coef,
            reference=node.reference,
            max_grad_norm=config.max_grad_norm,
            temperature=config.temperature,
            correction=config.correction,
            correction_cap=config.correction_cap,
            filter_kl=config.offpolicy_filter,
        )
    node.last_round = n
    if node.ratio is not None:
        node.ratio.observe([group for group, _ in own], assembled.external_rewards)

    row = round_metrics(
        round=n,
        own=[group for group, _ in own],
        new_tokens=sum(g.num_tokens for g in generated),
        assembled=assembled,
        update=update,
        counts=transport.counts(),
        connection=transport.status,
        timer=timer,
    )
    # Per question (in draw order): which tasks the node can do, e.g. for the skill-transfer study.
    row["question_rewards"] = [sum(g.rewards) / len(g.rewards) for g, _ in own]
    node.metrics_log.write(row)
    transport.tell_state(
        protocol.NODE_TRAINING,
        round_seconds=round(sum(timer.seconds.values()), 3),
        tokens_per_second=round(row["tokens_per_s"], 1),
    )
    transport.report(round_report(n, row, train_set, local=config.local, external=config.external))
    # The server's held-out check, if it asked one: a few greedy answers between two rounds.
    answer_pending_check(model, tokenizer, transport, round=n, max_new_tokens=config.max_new_tokens)
    if config.checkpoint_every and n % config.checkpoint_every == 0:
        if save_checkpoint(node.out, n, node.state, keep=config.keep_checkpoints) is not None:
            node.last_saved = n
    return row


def finish_node(node: Node) -> TransportCounts | None:
    """Checkpoint the last complete round, give pending shares a last chance, close what we opened.
    Returns the verdicts on the node's shares (None offline), read before the transport closes."""
    if node.last_round > node.last_saved:
        if save_checkpoint(node.out, node.last_round, node.state, keep=node.config.keep_checkpoints) is not None:
            node.last_saved = node.last_round
    if node.idle is not None:
        node.idle.stop()
    transport = node.transport
    transport.tell_state(protocol.NODE_IDLE)  # connected, with no round to play
    shares = None
    if not isinstance(transport, SiloTransport):
        if not transport.flush(node.config.flush_wait):
            if pending := transport.counts().pending:
                print(f"{pending} shared groups still wait for the server; they stay in the outbox")
            else:
                print(
                    "the server has not answered everything yet (an audit's upload, a report); "
                    "an audit it still asks for is uploaded at the next run"
                )
        shares = transport.counts()
    if node.owns_transport:
        transport.close()
    return shares


# ---------------------------------------------------------------------------- helpers of the loop


def load_model(config: NodeConfig) -> tuple[Any, Any]:
    dtype = None if config.dtype == "auto" else config.dtype
    server = None if config.offline else config.server  # a built-in model comes prebuilt from the site
    model, tokenizer, _device = load_policy(config.model, device=config.device, dtype=dtype, server=server)
    return model, tokenizer


def wait_while_paused(node: Node, stop: StopFlag | None) -> bool:
    """Wait while the node's pause gate holds (one line says why), then say it trains. Returns False
    when `stop` came meanwhile."""
    transport = node.transport

    held: list[frozenset[str]] = []

    def paused(reasons: frozenset[str]) -> None:
        held.append(reasons)
        print(pause_line(reasons, node.gate.details), flush=True)
        transport.tell_state(protocol.NODE_PAUSED)

    node.gate.wait(stop=lambda: stop is not None and stop.requested, on_pause=paused)
    if stop is not None and stop.requested:
        return False
    if held:
        print("resumed", flush=True)
    transport.tell_state(protocol.NODE_TRAINING)
    return True


def external_rules(config: NodeConfig) -> ExternalRules:
    """The config's corrected and gated sharing options, as assemble takes them."""
    return ExternalRules(
        model=config.model,
        use_logprobs=config.correction != "off" or config.offpolicy_filter is not None,
        mismatch=config.correction_mismatch,
        success_gate=config.success_gate,
        zone=(config.learning_zone_low, config.learning_zone_high),
    )


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def begin_commitment(
    store: CommitmentStore | None, model: Any, transport: Transport, questions: list[Question], stream: TaskStream
) -> Future[Commitment | None] | None:
    """Begin committing to the weights the round generates with when any of its questions is the
    server's challenge's (an audit may ask for them); otherwise only drop the commitments nothing keeps."""
    if store is None:
        return None
    keep = transport.unsettled_weights()
    if not any(stream.under_challenge(q.ref) for q in questions):
        store.prune(keep)
        return None
    return store.begin(model, keep=keep)


def sampling_keys(
    questions: list[Question], stream: TaskStream, generations: int, *, committed: bool
) -> list[list[bytes]]:
    """Each completion's sampling key: proof.completion_key under the server's challenge for its
    questions when the weights are committed (an audit replays them), else one from torch's generator
    (the same sampler, unaudited; a run seeded with --seed draws the same completions again)."""
    keys = []
    for q in questions:
        if committed and stream.under_challenge(q.ref):
            assert stream.challenge is not None
            c, ref = stream.challenge, q.ref
            keys.append([proof.completion_key(c, ref.dataset, ref.seed, ref.index, k) for k in range(generations)])
        else:
            keys += random_keys(1, generations)
    return keys


def attach_proofs(
    own: list[tuple[Group, Generated]],
    questions: list[Question],
    stream: TaskStream,
    commitment: Commitment,
    config: NodeConfig,
) -> None:
    """Give each group made under the server's challenge its proof (docs/protocol.md, "Proof of work")."""
    for (group, gen), q in zip(own, questions, strict=True):
        if stream.under_challenge(q.ref):
            assert stream.challenge is not None
            group.proof = make_proof(
                challenge=stream.challenge,
                weights=commitment.digest,
                model=config.model,
                temperature=config.temperature,
                completion_ids=gen.completion_ids,
                logprobs=gen.logprobs,
            )


def starting_catalogue(transport: Transport, config: NodeConfig) -> Catalogue:
    """The swarm's catalogue if its welcome comes within `connect_wait` seconds, else the default."""
    if transport.wait_connected(config.connect_wait) and (catalogue := transport.catalogue()) is not None:
        return catalogue
    if not isinstance(transport, SiloTransport):
        print(f"no catalogue from the swarm yet ({transport.status}): starting on {config.catalogue!r}", flush=True)
    return CATALOGUES[config.catalogue or "easy"]


def follow_swarm_catalogue(stream: TaskStream, transport: Transport) -> None:
    """Switch to the swarm's catalogue once it is known (the pool rejects tasks outside it)."""
    catalogue = transport.catalogue()
    if catalogue is not None and catalogue != stream.catalogue:
        stream.catalogue = catalogue


@dataclass
class StopFlag:
    requested: bool = False


@contextmanager
def stop_on_signals() -> Iterator[StopFlag]:
    """First Ctrl-C/SIGTERM: finish the current step and stop. Second Ctrl-C: stop at once."""
    flag = StopFlag()
    if threading.current_thread() is not threading.main_thread():
        yield flag  # signal handlers can only be set from the main thread
        return

    def handler(signum: int, frame: Any) -> None:
        if flag.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        flag.requested = True
        print("\nstopping after the current step (Ctrl-C again to abort now)...", file=sys.stderr, flush=True)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield flag
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
