"""`python manage.py sapo_local`: the site plus a local swarm of nodes, on embedded defaults.

This is what `make run` starts. It migrates the database (the embedded PostgreSQL when no
DATABASE_URL is set), opens two swarms (the site's default one, on the `--catalogue` tasks, which the
local nodes join, and `paper`, the SAPO paper's nine tasks, with no node: a newcomer sees the list at
/swarms/ and picks one), makes a `demo` contributor with one token per node, serves the site and the
WebSocket endpoint with daphne, and starts the nodes as separate `sapo-node run --swarm ...`
processes, the way a contributor would. Ctrl-C stops everything.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from accounts.models import User
from accounts.services import user_create
from alerts.models import AlertSettings
from nodes.models import Node
from nodes.services import node_provision, node_retire
from sapo_node.machine import Machine, choose_threads, read_machine
from sapo_node.tasks import CATALOGUES
from swarms.catalogue import entries_of_catalogue
from swarms.models import DEFAULT_TITLE, Swarm
from swarms.selectors import swarm_catalogue
from swarms.services import swarm_catalogue_set, swarm_create, swarm_default_ensure, swarm_update

REPO = Path(settings.BASE_DIR)


#: What a node prints when stopped: its own resume command, which names --server and --out that this
#: command gives it; `make run` resumes its nodes by itself, so that is what it says instead.
_RESUME_HINT = "; continue with: "


def _pump(prefix: str, stream) -> None:
    for line in iter(stream.readline, ""):
        if _RESUME_HINT in line:
            line = line.split(_RESUME_HINT, 1)[0] + "; make run resumes it\n"
        sys.stdout.write(f"{prefix} {line}")
        sys.stdout.flush()


class Command(BaseCommand):
    help = "Serve the site and run a local swarm of nodes against it (what `make run` does)."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1", help="Address the site listens on.")
        parser.add_argument("--port", type=int, default=8000, help="Port the site listens on.")
        parser.add_argument("--nodes", type=int, default=2, help="How many local nodes to start (0: the site only).")
        # tiny-mini by default: on a fresh machine its one build (~30 CPU-seconds) has every node training
        # within about two minutes; "tiny" costs about two CPU-minutes more (--models tiny,tiny-mini). Built
        # once for the site (var/models), which the nodes download it from.
        parser.add_argument(
            "--models", default="tiny-mini", help="Comma-separated models, cycled over the nodes (e.g. tiny,tiny-mini)."
        )
        parser.add_argument(
            "--silo",
            type=int,
            default=1,
            help="How many more nodes to start in silo (J = 0: trained on their own groups only), beside the "
            "sharing ones, so the swarm page compares both arms.",
        )
        parser.add_argument(
            "--rounds",
            type=int,
            default=0,
            help="Rounds per node; the command ends when every node has played them (0: until stopped).",
        )
        parser.add_argument(
            "--out",
            default=str(REPO / "var" / "local-swarm"),
            help="Folder of the nodes' run directories (one per node; a node resumes from its own).",
        )
        parser.add_argument(
            "--catalogue",
            default=os.environ.get("SAPO_CATALOGUE", "easy"),
            help="Task catalogue the pool accepts: 'easy' (the tiny model partly solves it) or 'sapo'.",
        )

    def handle(self, *args, host, port, nodes, silo, models, rounds, out, catalogue, **options):
        # Ctrl-C and a service manager's SIGTERM both mean "stop the swarm cleanly" (set explicitly:
        # a process started in the background by a script inherits SIGINT ignored).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
        model_list = [m.strip() for m in models.split(",") if m.strip()]
        if nodes > 0 and not model_list:
            raise CommandError("--models names no model")
        # (name, model, J): the sharing nodes keep the client's default J, the silo ones train with J = 0.
        assigned = [(f"local-{i + 1}", model_list[i % len(model_list)], None) for i in range(nodes)]
        assigned += [(f"silo-{k + 1}", model_list[k % len(model_list)], 0) for k in range(max(0, silo) if nodes else 0)]
        # Every process runs this checkout's code, whatever sapo-node the environment has installed.
        path = os.pathsep.join(
            filter(None, [str(REPO / "platform"), str(REPO / "node_client"), os.environ.get("PYTHONPATH")])
        )
        env = {**os.environ, "SAPO_CATALOGUE": catalogue, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path}
        swarm = _Swarm()
        try:
            self._start(swarm, env, host=host, port=port, plan=assigned, rounds=rounds, out=out)
            while swarm.server.poll() is None and not swarm.done(rounds):
                swarm.start_ready_nodes(self.stdout)
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
        finally:
            swarm.stop()
        if failed := swarm.failures():
            raise CommandError(f"{', '.join(failed)} failed; see the output above")

    def _start(
        self,
        swarm: _Swarm,
        env: dict,
        *,
        host: str,
        port: int,
        plan: list[tuple[str, str, int | None]],
        rounds: int,
        out: str,
    ):
        # The site publishes the built-in models its nodes run (`manage.py sapo_models build`: built
        # once into SAPO_PREBUILT_DIR, or copied from the nodes' cache when it holds the same recipe),
        # side by side and beside the database and site start-up (on a fresh machine "tiny" costs
        # about two CPU-minutes, "tiny-mini" a quarter of that). A node starts once its model is
        # published and the site answers, and downloads it from the site unless its cache has it.
        built_in = sorted({model for _, model, _ in plan} & set(BUILT_IN_MODELS))
        node_cache = env.get("SAPO_CACHE") or str(Path.home() / ".cache" / "sapo-node")
        for model in built_in:
            swarm.build(model, node_cache, threads=_threads(len(built_in)), env=env)
        if built_in:
            self.stdout.write(
                f"Publishing {', '.join(built_in)} to the nodes (built on first use); each node starts when its "
                "model is published, and downloads it from the site unless its cache has it."
            )

        call_command("migrate", interactive=False, verbosity=0)
        local = local_swarms(catalogue=env["SAPO_CATALOGUE"])
        swarm.server = _spawn(
            [sys.executable, "-m", "daphne", "-b", host, "-p", str(port), "config.asgi:application"],
            prefix="[site]  ",
            cwd=REPO / "platform",
            env=env,
        )
        self.stdout.write(
            self.style.SUCCESS(
                f"Site: http://{host}:{port}/  (swarms at /swarms/: {local.slug!r} with the local nodes, "
                f"catalogue {env['SAPO_CATALOGUE']}; {PAPER_SLUG!r} with the paper's nine tasks)"
            )
        )
        # The site's scheduled jobs (figures, badges, the daily export, alerts), every SCHEDULED_EVERY seconds; the console
        # email backend prints the alerts' emails here.
        swarm.scheduler = _spawn(
            [sys.executable, "manage.py", "sapo_scheduled", "--every", str(SCHEDULED_EVERY)],
            prefix="[jobs]  ",
            cwd=REPO,
            env=env,
        )

        # The audits' worker: replays the checkpoints the nodes upload when an audit asks (docs/audits.md);
        # without Redis it takes them from the database.
        swarm.auditor = _spawn(
            [sys.executable, "manage.py", "sapo_audit_worker"],
            prefix="[audits]",
            cwd=REPO,
            env={
                # The built-in models as the site published them to its nodes, not built again.
                "SAPO_AUDIT_MODEL_CACHE": str(settings.SAPO_PREBUILT_DIR),
                **env,
                "OMP_NUM_THREADS": "1",
            },
        )

        for i, (name, model, external) in enumerate(plan):
            node, token = local_node(name, model)
            node_out = Path(out) / f"{node.name}-{model}"  # a node that changes model starts afresh
            cmd = [
                sys.executable,
                "-m",
                "sapo_node",
                "run",
                "--server",
                f"ws://{host}:{port}",
                "--model",
                model,
                "--seed",
                str(i + 1),
                "--out",
                str(node_out),
                "--resume",
                "--swarm",
                local.slug,
            ]
            if rounds:
                cmd += ["--rounds", str(rounds)]
            if external is not None:
                cmd += ["--external", str(external)]
            cmd += model_flags(model)
            # Nodes share the machine's cores instead of each taking all of them (torch's default),
            # which on a small machine makes every node slower than one would be alone.
            node_env = {**env, "SAPO_TOKEN": token, "OMP_NUM_THREADS": _threads(len(plan))}
            swarm.pending.append(_PendingNode(node.name, model, node_out, cmd, node_env))
        demo_alerts_on(username="demo")
        swarm.site = (host, port)
        swarm.start_ready_nodes(self.stdout)
        manage = f"{shlex.quote(_python_as_typed())} manage.py changepassword"
        self.stdout.write(
            self.style.SUCCESS(
                f"Local swarm running. To log in, set a password in another terminal: {manage} demo "
                f"(the nodes' contributor), or {manage} operator (staff: moderation and swarm pages). "
                "Ctrl-C stops everything."
            )
        )


def local_node(name: str, model: str) -> tuple[Node, str]:
    """The demo contributor's node `name` for `model`, with a fresh token. A node that trained another
    model is retired (its history kept under its old record) and a new one made, so no figure of one
    model is shown under another."""
    node, token = node_provision(username="demo", node_name=name, model_id=model, rotate=True)
    if node.model_id and node.model_id != model:
        node_retire(node=node)
        node, token = node_provision(username="demo", node_name=name, model_id=model, rotate=True)
    return node, token


def _python_as_typed() -> str:
    """This interpreter as a user types it from the repository: `.venv/bin/python`, not a bare
    `python` that may lack the site's packages."""
    exe = Path(sys.executable)
    try:
        return str(exe.relative_to(REPO))
    except ValueError:
        return str(exe)


#: The second swarm of a local site: the SAPO paper's nine tasks, for GPU nodes, none started here.
PAPER_SLUG = "paper"


def local_swarms(*, catalogue: str) -> Swarm:
    """The local site's two swarms, made on its first start and kept after (by a staff account of its
    own, `operator`, so the audit log names who did it): the default swarm, on `catalogue`'s tasks,
    which the local nodes join; and PAPER_SLUG. Returns the first."""
    operator = User.objects.filter(username="operator").first()
    if operator is None:
        operator = user_create(username="operator", display_name="Local operator", password=None)
        operator.is_staff = True
        operator.save(update_fields=["is_staff"])
    local = swarm_default_ensure()
    entries = entries_of_catalogue(CATALOGUES[catalogue])
    if swarm_catalogue(swarm=local).entries != entries:
        swarm_catalogue_set(actor=operator, swarm=local, entries=entries, reason=f"make run: the {catalogue} tasks")
    if local.title == DEFAULT_TITLE:
        local = swarm_update(
            actor=operator,
            swarm=local,
            title=f"Local swarm ({catalogue} tasks)",
            description="The nodes `make run` starts on this machine train here.",
            recommended_models=["tiny-mini", "tiny"],
            reason="make run",
        )
    if not Swarm.objects.filter(slug=PAPER_SLUG).exists():
        swarm_create(
            actor=operator,
            slug=PAPER_SLUG,
            title="The paper's nine tasks",
            description="The SAPO paper's nine reasoning-gym specialties, for real models on GPUs.",
            entries=entries_of_catalogue(CATALOGUES["sapo"]),
            recommended_models=["Qwen/Qwen2.5-0.5B-Instruct"],
            reason="make run",
        )
    return local


#: Seconds between two runs of the scheduled jobs.
SCHEDULED_EVERY = 60


def demo_alerts_on(*, username: str) -> None:
    """Email alerts for the demo contributor (to demo@localhost, printed by the console backend),
    unless they already chose their settings. The address is a local one of this machine's own demo
    account, so it is set confirmed (every other address confirms through its link)."""
    user = User.objects.filter(username=username).first()
    if user is not None and not AlertSettings.objects.filter(user=user).exists():
        User.objects.filter(id=user.id).update(email=f"{username}@localhost", email_confirmed_at=timezone.now())
        AlertSettings.objects.create(user=user, email_alerts=True)


#: Models the node client builds itself that make run publishes to its nodes (of sapo_node.tiny.variants.VARIANTS).
BUILT_IN_MODELS = ("tiny", "tiny-mini")

#: Node options for any other model (a real one, e.g. smollm2-135m) on a laptop: a GRPO update of 16
#: sequences of up to 256 new tokens at once held 11 GB for SmolLM2-135M (docs/node.md).
REAL_MODEL_FLAGS = ["--max-new-tokens", "64", "--micro-batch", "4"]

#: Node options for the built-in models: a KL penalty to the initial policy. make run plays a thousand
#: rounds a node in fifteen minutes, and without the anchor a tiny model's policy drifts into runs of one
#: character (`<answer>>>>>>>>>>>>>>>>>`) that the characters rule rightly holds (docs/moderation.md,
#: "Today's make run").
BUILT_IN_MODEL_FLAGS = ["--kl-coef", "0.1"]


def model_flags(model: str) -> list[str]:
    """The node options make run adds for `model`, beside the ones every node gets."""
    return list(BUILT_IN_MODEL_FLAGS if model in BUILT_IN_MODELS else REAL_MODEL_FLAGS)


def _threads(processes: int, machine: Machine | None = None) -> str:
    """Torch threads for each of `processes` processes sharing the cores that other work leaves idle
    (this machine's when none is given), by the rule a node uses alone (machine.choose_threads):
    threads on a core that another process is using spin-wait against it."""
    idle = choose_threads(machine or read_machine("cpu"), environ={})
    return str(max(1, idle // max(1, processes)))


def _spawn(cmd: list[str], *, prefix: str, **kwargs) -> subprocess.Popen:
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # Ctrl-C reaches this command only; it stops the others in order
        **kwargs,
    )
    threading.Thread(target=_pump, args=(prefix, proc.stdout), daemon=True).start()
    return proc


@dataclass
class _PendingNode:
    name: str
    model: str
    out: Path
    cmd: list[str]
    env: dict


@dataclass
class _Swarm:
    """The processes of a local swarm: model builders, the site, the nodes (started when their
    model is built), and how they stop."""

    builders: dict[str, subprocess.Popen] = field(default_factory=dict)
    server: subprocess.Popen | None = None
    #: Where the site listens: nodes start once it accepts connections (they download their model there).
    site: tuple[str, int] | None = None
    scheduler: subprocess.Popen | None = None
    auditor: subprocess.Popen | None = None
    pending: list[_PendingNode] = field(default_factory=list)
    nodes: dict[str, subprocess.Popen] = field(default_factory=dict)

    def build(self, model: str, node_cache: str, *, threads: str, env: dict) -> None:
        cmd = [sys.executable, "manage.py", "sapo_models", "build", "--models", model, "--from-cache", node_cache]
        cmd += ["--threads", threads]
        self.builders[model] = _spawn(cmd, prefix=f"[build {model}]", cwd=REPO, env=env)

    def start_ready_nodes(self, stdout) -> None:
        if self.pending and not self._site_listens():
            return
        for pending in list(self.pending):
            builder = self.builders.get(pending.model)
            if builder is not None and builder.poll() is None:
                continue  # still building
            self.pending.remove(pending)
            if builder is not None and builder.returncode != 0:
                continue  # reported by failures()
            self.nodes[pending.name] = _spawn(pending.cmd, prefix=f"[{pending.name}]", env=pending.env)
            stdout.write(f"Node {pending.name} ({pending.model}) -> {pending.out}")

    def _site_listens(self) -> bool:
        if self.site is None:
            return False
        try:
            with socket.create_connection(self.site, timeout=0.5):
                return True
        except OSError:
            return False

    def done(self, rounds: int) -> bool:
        """A model failed to build (its nodes cannot start), or, with --rounds, every node has
        played them."""
        if any(p.poll() not in (None, 0) for p in self.builders.values()):
            return True
        return bool(rounds) and not self.pending and all(p.poll() is not None for p in self.nodes.values())

    def stop(self) -> None:
        """Builders first (a half-built model is not kept), then the nodes, while the site still
        runs (each finishes its step, flushes its outbox and saves a checkpoint), then the site.
        SIGTERM, not SIGINT: a process still importing its libraries may swallow a KeyboardInterrupt
        (numpy's import does) and carry on, or print a traceback; SIGTERM ends it quietly there, and
        the node's loop and daphne treat it as "stop cleanly" once they run. A second Ctrl-C while
        stopping kills whatever is left."""
        try:
            _stop(list(self.builders.values()), timeout=15)
            _stop(list(self.nodes.values()), timeout=60)
            _stop([p for p in (self.auditor, self.scheduler, self.server) if p is not None], timeout=15)
        except KeyboardInterrupt:
            for proc in [*self.builders.values(), *self.nodes.values(), self.auditor, self.scheduler, self.server]:
                if proc is not None and proc.poll() is None:
                    proc.kill()

    def failures(self) -> list[str]:
        stopped = (0, 130, -signal.SIGTERM)
        failed = [f"building {m}" for m, p in self.builders.items() if p.returncode not in stopped]
        failed += [name for name, p in self.nodes.items() if p.returncode not in stopped]
        return failed


def _raise_keyboard_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _stop(procs: list[subprocess.Popen], *, timeout: float) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
