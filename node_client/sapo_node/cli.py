"""The `sapo-node` command line.

    sapo-node run --server wss://HOST/ws/node/ --token TOKEN      # join the site's default swarm
    sapo-node run --server ... --token ... --swarm SLUG           # join one of its swarms (or: any)
    sapo-node run --offline --rounds 20 --out runs/silo           # train alone
    sapo-node run --resume --out runs/silo --rounds 40            # continue a stopped run (online: with --server)
    sapo-node export --run runs/silo --out models/silo            # the trained model, as a HF folder
    sapo-node service install --server URL --model tiny-mini      # run it as a user service (systemd, launchd)

Adding a subcommand is one function `add_command(subparsers)` that registers a parser and sets
`handler=callable(args) -> exit code`: write it in a module and list the module in COMMAND_MODULES. The
research harness (the paper's controlled experiment) is no subcommand: it starts the platform from
the repository checkout, so it lives there (`python -m research`, docs/experiment.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import logging
import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sapo_node import __version__
from sapo_node.config import NodeConfig, field_docs
from sapo_node.machine import read_machine

if TYPE_CHECKING:
    from sapo_node.loop import RunResult  # torch: imported only once a run starts

#: Modules that add subcommands beside `run`, each with add_command(subparsers).
COMMAND_MODULES = ("sapo_node.export", "sapo_node.service")

#: Short metavars for the flags SAPO's paper names with a letter.
METAVARS = {
    "questions": "B",
    "generations": "G",
    "local": "I",
    "external": "J",
    "rounds": "R",
    "seed": "S",
    "out": "DIR",
    "server": "URL",
    "token": "T",
    "model": "ID_OR_PATH",
    "correction_cap": "C",
    "pause_when_busy": "LOAD",
}
CHOICES = {
    "device": None,
    "catalogue": ["easy", "sapo"],
    "ratio": ["fixed", "adaptive"],
    "external_baseline": ["group", "own"],
    "correction": ["off", "token", "sequence"],
    "correction_mismatch": ["uncorrected", "skip"],
    "dtype": ["auto", "float32", "bfloat16", "float16"],
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sapo-node",
        description="A SAPO swarm node: trains a language model with GRPO on its own rollouts and the swarm's.",
    )
    parser.add_argument("--version", action="version", version=f"sapo-node {__version__}")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    add_run_command(subparsers)
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_command(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "handler"):
        parser.print_help()
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.handler(args))
    except KeyboardInterrupt:  # before a run's own handler is in place (loading the model, connecting)
        print("stopped", file=sys.stderr)
        return 130


# ---------------------------------------------------------------------------- sapo-node run


def add_run_command(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "run",
        help="train: run rounds of sample -> generate -> score -> share -> assemble -> GRPO update",
        description="Run a node. Every flag maps to a field of the run's config (saved as DIR/config.json).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_config_flags(parser)
    parser.set_defaults(handler=run_command)


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per NodeConfig field, its help the field's docstring. Flags default to "not given",
    so a resumed run can tell the flags given now from the saved config they override."""
    docs, defaults = field_docs(), NodeConfig()
    for f in dataclasses.fields(NodeConfig):
        flag = "--" + f.name.replace("_", "-")
        default = getattr(defaults, f.name)
        shown = "" if f.type == "bool" or default is None else f" (default: {default})"
        help_text = docs.get(f.name, "") + shown
        if f.type == "bool":
            parser.add_argument(flag, dest=f.name, action="store_true", default=argparse.SUPPRESS, help=help_text)
            continue
        kind = int if f.type.startswith("int") else float if f.type.startswith("float") else str
        parser.add_argument(
            flag,
            dest=f.name,
            type=kind,
            default=argparse.SUPPRESS,
            metavar=METAVARS.get(f.name, f.name.upper()),
            choices=CHOICES.get(f.name),
            help=help_text,
        )


def config_from_args(args: argparse.Namespace) -> NodeConfig:
    """Defaults (or, with --resume, the saved config.json), then the environment, then the flags given."""
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(NodeConfig) if hasattr(args, f.name)}
    config = NodeConfig()
    saved = Path(given.get("out", config.out)) / "config.json"
    if given.get("resume") and saved.exists():
        config = NodeConfig.from_json(json.loads(saved.read_text()))
        if "model" in given and given["model"] != config.model:
            raise ValueError(
                f"{saved.parent} holds a run of model {config.model!r}: its checkpoints cannot load into "
                f"{given['model']!r}. Resume with --model {config.model}, or start the new model in another --out."
            )
        refuse_a_server_the_user_has_not_named(saved.parent, config, given)
        config.server = None  # a resumed run connects to the user's --server or SAPO_SERVER only
        config.threads = None  # the machine's load has changed since: chosen again unless given
        # The idle policy is the command's, not the run's: a service installed again without it stops pausing.
        config.pause_when_busy, config.pause_on_battery = None, False
    config.server = os.environ.get("SAPO_SERVER") or config.server
    config.token = os.environ.get("SAPO_TOKEN") or None
    if not config.token and os.environ.get("SAPO_TOKEN_FILE"):  # a user service's (sapo_node.service)
        from sapo_node.token_file import token_from_file

        config.token = token_from_file(os.environ["SAPO_TOKEN_FILE"])
    config.swarm = os.environ.get("SAPO_SWARM") or config.swarm
    return dataclasses.replace(config, **given)


def refuse_a_server_the_user_has_not_named(folder: Path, saved: NodeConfig, given: dict[str, Any]) -> None:
    """Raise ValueError when the run folder names a server the user has not. The token goes to the
    server a run connects to, so that is the user's choice (--server or SAPO_SERVER), never the run
    folder's alone: a folder may come from someone else, and its config.json may name their server."""
    named = saved.server
    if not named or given.get("offline", saved.offline) or "server" in given:
        return  # nothing to connect to, or the user named the server on the command line
    own = os.environ.get("SAPO_SERVER")
    if own == named:
        return
    named_arg, own_arg = shlex.quote(named), shlex.quote(own or "")
    if own:
        raise ValueError(
            f"{folder} was a run on the server {named!r}, but SAPO_SERVER is {own!r}: your token goes only to a "
            f"server you name, so resume with --server {own_arg} (or --server {named_arg} to go back to the folder's)"
        )
    raise ValueError(
        f"{folder} names the server {named!r}: your token goes only to a server you name, so resume with "
        f"--server {named_arg} if you trust it (or set SAPO_SERVER), or with --offline"
    )


def run_command(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
        if not config.offline and not config.server:
            raise ValueError("give --server URL (or set SAPO_SERVER), or --offline to train alone")
        # Sized before torch loads: a model too large for the machine is refused in a second.
        config, line = config.fit_to(read_machine(config.device))
        config = config.resolved()
    except ValueError as exc:
        print(f"sapo-node run: error: {exc}", file=sys.stderr)
        return 2
    print(line, flush=True)
    # torch and transformers load only once the command is known to be whole: a mistyped one fails at once
    from sapo_node.checkpoint import CheckpointError
    from sapo_node.loop import run

    try:
        result = run(config)
    except CheckpointError as exc:
        print(f"sapo-node run: error: {exc}", file=sys.stderr)
        return 2
    if result.interrupted:
        print(f"stopped after round {result.last_round}; continue with: {resume_command(config)}")
        return 130
    print(closing_line(result))
    return 0


def resume_command(config: NodeConfig) -> str:
    """The command that continues this run. A resumed run takes the rest from the folder's config.json,
    but never its server (see config_from_args), so an online run names the one it used; the token
    stays out, as the printed line may be pasted anywhere."""
    command = ["sapo-node", "run", "--resume", "--out", str(config.out)]
    if not config.offline:
        command += ["--server", str(config.server)]
    return shlex.join(command)


def closing_line(result: RunResult) -> str:
    """What a run that played its last round did, and how to take its model away."""
    played, last = len(result.metrics), result.last_round
    if played == 0:
        line = f"done: no round to play, round {last} was the last"
    else:
        rounds = f"round {last}" if played == 1 else f"rounds {last - played + 1}-{last}"
        line = f"done: {played} round{'s' if played != 1 else ''} ({rounds}) in {result.seconds:.0f} s"
    if result.shares is not None:
        line += f"; shares: {result.shares.accepted} accepted, {result.shares.pending} pending"
    model = Path(result.out).parent / f"{Path(result.out).name}-model"
    export = shlex.join(["sapo-node", "export", "--run", str(result.out), "--out", str(model)])
    return f"{line}; the model: {export}"
