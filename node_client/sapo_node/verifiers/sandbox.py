"""The sandbox: worker processes that run scorers nobody here has reviewed, under limits they cannot lift.

Used for datasets outside vetted.VERIFIERS (a catalogue from a server this node does not know) and
for a listed dataset whose reasoning-gym code changed since review. Catalogue datasets are not sent
here: their scorers are bounded by construction and run in the caller's process (see `score_answers`
in this package for why, with the measurement).

What holds a worker, none of it depending on the scorer's goodwill:

- **Wall clock, from the parent.** Each answer may take `seconds_per_answer`; the parent watches
  the worker's progress counter (shared memory) and SIGKILLs a worker whose current answer has run
  longer. The answers it finished keep their scores, the one it was on gets None (timed out), and
  the rest go to a fresh worker. So a group of n answers takes at most n x `seconds_per_answer`.
- **CPU time, from the kernel.** Before each batch the worker sets its RLIMIT_CPU soft limit to the
  CPU it has used plus the batch's allowance, so a runaway scorer gets SIGXCPU even if the parent
  were stalled.
- **Memory, from the kernel.** RLIMIT_AS is the worker's size at start plus `memory_bytes`: a scorer
  that builds a huge structure gets MemoryError (scored 0) instead of taking the machine's memory.
  The datasets a worker keeps must not use that room up: a worker left with less than `headroom` of
  it after a batch that built one forgets them (and ends, if that frees too little), so the next
  batch's message and dataset fit; a worker that dies before it has taken a batch hands the batch to
  a fresh one.
- **No code from the answer.** While a scorer runs, an audit hook (sys.addaudithook: it cannot be
  removed, and Python raises its events for eval, exec, compile and imports, from C too) refuses
  compiling or running code, importing, opening files, processes, sockets and resource limits. A
  scorer that calls `eval(answer)` gets an exception instead (reasoning-gym catches it: score 0).

One parent-to-worker message per batch of answers (a group's, up to MAX_BATCH), not per answer.
Workers come from a fork server that has already imported reasoning-gym, so replacing a killed worker
costs a fork, not a second of imports. Thread-safe: each worker serves one batch at a time, at most
`workers` batches run at once, and other callers wait for a free worker.
"""

from __future__ import annotations

import gc
import math
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

try:
    import resource
except ImportError:  # Windows: the wall clock still holds
    resource = None  # type: ignore[assignment]

#: Wall-clock seconds one answer may take in a worker before the worker is killed.
SECONDS_PER_ANSWER = 0.5
#: Memory a worker may add to its size at start (RLIMIT_AS).
MEMORY_BYTES = 512 * 1024 * 1024
#: Share of its memory a worker keeps free between batches, for the next batch's message (a
#: count_primes entry lists its primes: about 10 MiB unpickled at max_n 5 million) and its dataset.
HEADROOM = 0.25
#: Wall-clock seconds a worker may take to build the dataset before its first answer (not answer
#: text: the catalogue's config and a seed; reasoning-gym loads word lists for some datasets).
BUILD_SECONDS = 10.0
#: Answers per message to a worker.
MAX_BATCH = 64
# How often the parent looks at a busy worker's progress (a finished batch is seen at once).
_POLL_SECONDS = 0.02
# A worker's progress counter: the parent sets _SENT before each batch, the worker _RECEIVED once it
# holds it, 0 once it has built the dataset, then the number of answers scored.
_SENT = -2
_RECEIVED = -1

# Audit events refused while a scorer runs (prefixes).
_REFUSED_EVENTS = (
    "compile",
    "exec",
    "import",
    "open",
    "os.",
    "subprocess.",
    "socket.",
    "shutil.",
    "ctypes.",
    "pty.",
    "resource.",
    "code.__new__",
    "function.__new__",
    "marshal.",
    "pickle.",
    "urllib.",
    "http.",
    "ftplib.",
    "smtplib.",
    "glob.",
    "tempfile.",
    "sqlite3.",
    "mmap.",
    "webbrowser.",
    "cpython.",
)


class CodeRefused(RuntimeError):
    """Raised inside a worker when a scorer tries to compile, run or import code, or touch the system."""


_armed = False  # set by the worker only around a scorer's call


def _audit(event: str, args: tuple) -> None:
    if _armed and event.startswith(_REFUSED_EVENTS):
        raise CodeRefused(event)


def vm_bytes() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def tell_parent(conn: Connection, message: Any) -> bool:
    """Send `message` on a worker's pipe; False when the process that asked for the work is gone. A
    worker comes from the fork server, not from that process, so it outlives it: stopped with Ctrl-C
    while the worker runs, the process has closed its end, and the worker ends quietly instead of
    printing a BrokenPipeError traceback into the terminal."""
    try:
        conn.send(message)
    except OSError:  # BrokenPipeError, ConnectionResetError: nobody is reading any more
        return False
    return True


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _serve(conn: Connection, progress: Any, results: Any, memory_bytes: int, headroom_bytes: int) -> None:
    """A worker's loop: one batch per message; each score into `results`, then `progress` counts it.
    It answers each batch with whether it has room for another (False: it is ending)."""
    from sapo_node.datasets import datasets_forget  # imported before the hook is armed

    limit = None
    if resource is not None:
        size = vm_bytes()
        if size is not None:
            limit = size + memory_bytes
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    sys.addaudithook(_audit)
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):  # the process it scores for has gone
            return
        except MemoryError:  # the batch does not fit beside what this worker holds: a fresh one takes it
            return
        progress.value = _RECEIVED
        built = _score_job(progress, results, *job)
        del job  # its message is freed before the next one arrives
        # Only a dataset it keeps grows it from one batch to the next (reading its size costs as much
        # as scoring a batch of 8 cached answers).
        room = _make_room(limit, headroom_bytes, datasets_forget) if built else True
        if not tell_parent(conn, room) or not room:
            return


def _score_job(
    progress: Any,
    results: Any,
    dataset: str,
    config: dict[str, Any],
    seed: int,
    entry: dict[str, Any],
    answers: list[str],
    cpu_seconds: int,
) -> bool:
    """Score one batch into `results`; whether it built a dataset (not one this worker kept)."""
    global _armed
    from sapo_node.datasets import TaskSpec, dataset_cached, dataset_for, datasets_forget

    spec = TaskSpec(dataset, config)
    built = not dataset_cached(spec, seed)
    if resource is not None:
        soft = math.ceil(_cpu_seconds() + cpu_seconds)
        _, hard = resource.getrlimit(resource.RLIMIT_CPU)
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
    try:
        try:
            instance = dataset_for(spec, seed)
        except MemoryError:  # the datasets this worker keeps took its memory: this one goes alone
            datasets_forget()
            instance = dataset_for(spec, seed)
    except Exception:
        instance = None
    progress.value = 0  # built: the clock of the first answer starts
    for k, answer in enumerate(answers):
        score = 0.0
        if instance is not None:
            _armed = True
            try:
                score = float(instance.score_answer(answer, entry))
            except Exception:  # refused code, MemoryError, RecursionError, a parser's own error
                score = 0.0
            finally:
                _armed = False
        results[k] = min(1.0, max(0.0, score)) if score == score else 0.0  # NaN scores 0
        progress.value = k + 1
    return built


def _make_room(limit: int | None, headroom: int, forget: Callable[[], None]) -> bool:
    """Whether this worker has `headroom` below its memory limit, once it has forgotten the datasets it
    keeps if it had less. Without that room, the next batch's message can take the last of it: the
    worker then dies receiving it, not building or scoring, where a MemoryError is caught."""
    size = vm_bytes() if limit is not None else None
    if size is None or limit - size >= headroom:
        return True
    forget()
    gc.collect()
    size = vm_bytes()
    return size is None or limit - size >= headroom


class _Worker:
    def __init__(self, ctx: Any, memory_bytes: int, headroom_bytes: int) -> None:
        self.batches = 0  # finished
        self.room = True  # whether it has room for another batch (False: it has ended)
        self.progress = ctx.RawValue("i", 0)
        self.results = ctx.RawArray("d", MAX_BATCH)
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(
            target=_serve,
            args=(child, self.progress, self.results, memory_bytes, headroom_bytes),
            daemon=True,
            name="sapo-scorer",
        )
        self.process.start()
        child.close()

    def kill(self) -> None:
        self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()

    def run(self, job: tuple, n: int, seconds_per_answer: float) -> tuple[list[float], int | None]:
        """Scores of the answers finished, and None when all n were; else this worker was killed or
        died, and the second item is its progress then: _SENT (before it took the batch), _RECEIVED
        (building the dataset), or k (scoring answer k, the one that ran out of time)."""
        self.progress.value = _SENT
        try:
            self.conn.send(job)
        except OSError:  # it ended while the message was on its way (it did not fit)
            return self._stopped()
        seen, since = _SENT, time.monotonic()
        while True:
            if self.conn.poll(_POLL_SECONDS):
                try:
                    self.room = self.conn.recv()
                except (EOFError, OSError):  # killed by the kernel (RLIMIT_CPU) or crashed
                    return self._stopped()
                self.batches += 1
                return list(self.results[:n]), None
            done = self.progress.value
            now = time.monotonic()
            if done != seen:
                seen, since = done, now
            elif now - since > (BUILD_SECONDS if done < 0 else seconds_per_answer):
                return self._stopped()

    def _stopped(self) -> tuple[list[float], int]:
        done = self.progress.value
        self.kill()
        return list(self.results[: max(done, 0)]), done


def worker_context() -> Any:
    """The multiprocessing context workers start from: a fork server that has imported reasoning-gym
    where there is one (Linux, macOS), else spawn."""
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
    if "forkserver" in methods:
        # Workers fork from a process that has imported reasoning-gym once (a second of CPU), and
        # inherit nothing of the caller (its threads, sockets, database connections, torch). Not
        # this package: the fork server imports with the interpreter's default path, not the
        # caller's (Python 3.11 ignores it there), while each worker gets the caller's path
        # before it imports the code it runs.
        ctx.set_forkserver_preload(["reasoning_gym"])
    return ctx


class ScoringSandbox:
    """A pool of scoring workers; `score` may be called from any thread."""

    def __init__(
        self,
        *,
        workers: int | None = None,
        seconds_per_answer: float = SECONDS_PER_ANSWER,
        memory_bytes: int = MEMORY_BYTES,
        headroom: float = HEADROOM,
    ) -> None:
        self._ctx = worker_context()
        self.workers = workers or max(1, min(4, os.cpu_count() or 1))
        self.seconds_per_answer = seconds_per_answer
        self.memory_bytes = memory_bytes
        self.headroom_bytes = int(memory_bytes * headroom)
        self._slots = threading.BoundedSemaphore(self.workers)
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self.killed = 0  # workers killed for running out of time or dying (for tests and the benchmark)

    def score(
        self, dataset: str, config: dict[str, Any], seed: int, entry: dict[str, Any], answers: Sequence[str]
    ) -> list[float | None]:
        """reasoning-gym's score of each answer for `entry`, or None for an answer that ran out of time."""
        out: list[float | None] = []
        for start in range(0, len(answers), MAX_BATCH):
            out += self._score_batch(dataset, config, seed, entry, list(answers[start : start + MAX_BATCH]))
        return out

    def _score_batch(
        self, dataset: str, config: dict[str, Any], seed: int, entry: dict[str, Any], answers: list[str]
    ) -> list[float | None]:
        out: list[float | None] = []
        while len(out) < len(answers):
            rest = answers[len(out) :]
            # The kernel's limit is a backstop behind the parent's clock: whole seconds, and generous.
            cpu_seconds = math.ceil(len(rest) * self.seconds_per_answer) + 1
            job = (dataset, config, seed, entry, rest, cpu_seconds)
            with self._slots:
                worker = self._take()
                scores, stopped = worker.run(job, len(rest), self.seconds_per_answer)
                if stopped is None:
                    self._give_back(worker)
                else:
                    with self._lock:
                        self.killed += 1
            out += scores
            if stopped is None:
                continue
            if stopped == _SENT and worker.batches:
                continue  # it ended before taking the batch, short of room after the last: a fresh one may
            if stopped < 0:
                return out + [None] * (len(answers) - len(out))  # no worker will build it faster
            if len(out) < len(answers):
                out.append(None)  # the answer it was on when it was stopped
        return out

    def _take(self) -> _Worker:
        with self._lock:
            while self._idle:
                worker = self._idle.pop()
                if worker.process.is_alive():
                    return worker
                worker.kill()
        return _Worker(self._ctx, self.memory_bytes, self.headroom_bytes)

    def _give_back(self, worker: _Worker) -> None:
        if not worker.room:  # it has ended: forgetting its datasets left it short of room
            worker.kill()
            return
        with self._lock:
            self._idle.append(worker)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.kill()


_sandbox: ScoringSandbox | None = None
_sandbox_lock = threading.Lock()


def sandbox() -> ScoringSandbox:
    """This process's sandbox, started on first use (a process that only scores catalogue datasets
    never starts one)."""
    global _sandbox
    with _sandbox_lock:
        if _sandbox is None:
            _sandbox = ScoringSandbox()
        return _sandbox
