"""`python manage.py sapo_local`: the site plus a local swarm of nodes, on embedded defaults.

This is what `make run` starts. It migrates the database (the embedded PostgreSQL when no
DATABASE_URL is set), makes a `demo` contributor with one token per node, serves the site and the
WebSocket endpoint with daphne, and starts the nodes as separate `sapo-node run` processes, the
way a contributor would. Ctrl-C stops everything.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from nodes.services import node_provision

REPO = Path(settings.BASE_DIR)


def _pump(prefix: str, stream) -> None:
    for line in iter(stream.readline, ""):
        sys.stdout.write(f"{prefix} {line}")
        sys.stdout.flush()


class Command(BaseCommand):
    help = "Serve the site and run a local swarm of nodes against it (what `make run` does)."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1", help="Address the site listens on.")
        parser.add_argument("--port", type=int, default=8000, help="Port the site listens on.")
        parser.add_argument("--nodes", type=int, default=2, help="How many local nodes to start (0: the site only).")
        parser.add_argument("--models", default="tiny,tiny-mini", help="Comma-separated models, cycled over the nodes.")
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

    def handle(self, *args, host, port, nodes, models, rounds, out, catalogue, **options):
        # Ctrl-C and a service manager's SIGTERM both mean "stop the swarm cleanly" (set explicitly:
        # a process started in the background by a script inherits SIGINT ignored).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
        call_command("migrate", interactive=False, verbosity=0)
        env = {**os.environ, "SAPO_CATALOGUE": catalogue, "PYTHONUNBUFFERED": "1"}

        nodes_running: list[subprocess.Popen] = []
        server = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", host, "-p", str(port), "config.asgi:application"],
            cwd=REPO / "platform",
            env={**env, "PYTHONPATH": os.pathsep.join([str(REPO / "platform"), str(REPO / "node_client")])},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # Ctrl-C reaches this command only; it stops the nodes first
        )
        threading.Thread(target=_pump, args=("[site]  ", server.stdout), daemon=True).start()
        self.stdout.write(self.style.SUCCESS(f"Site: http://{host}:{port}/  (catalogue: {catalogue})"))

        model_list = [m.strip() for m in models.split(",") if m.strip()]
        time.sleep(2.0)  # let daphne bind before the nodes dial in; they retry with backoff anyway
        for i in range(nodes):
            model = model_list[i % len(model_list)]
            node, token = node_provision(username="demo", node_name=f"local-{i + 1}", model_id=model, rotate=True)
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
            ]
            if rounds:
                cmd += ["--rounds", str(rounds)]
            proc = subprocess.Popen(
                cmd,
                env={**env, "SAPO_TOKEN": token},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
            nodes_running.append(proc)
            threading.Thread(target=_pump, args=(f"[{node.name}]", proc.stdout), daemon=True).start()
            self.stdout.write(f"Node {node.name} ({model}) -> {node_out}")

        self.stdout.write(
            self.style.SUCCESS(
                "Local swarm running. Log in as 'demo'? Set a password with: "
                "python manage.py changepassword demo. Ctrl-C stops everything."
            )
        )
        try:
            # With --rounds the swarm is done when every node is; otherwise it runs until stopped.
            while server.poll() is None and not (rounds and all(p.poll() is not None for p in nodes_running)):
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
        finally:
            # Nodes first, while the site still runs: each finishes its step, flushes its outbox
            # and saves a checkpoint. Then the site.
            _stop(nodes_running, timeout=60)
            _stop([server], timeout=15)
        failed = [i + 1 for i, p in enumerate(nodes_running) if p.returncode not in (0, 130, -signal.SIGINT)]
        if failed:
            raise CommandError(f"node(s) {', '.join(f'local-{i}' for i in failed)} failed; see their output above")


def _raise_keyboard_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _stop(procs: list[subprocess.Popen], *, timeout: float) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
