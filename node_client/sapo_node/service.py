"""`sapo-node service print|install|uninstall`: the node as a user service that starts with the session
and restarts after a failure, niced and capped in CPU.

    sapo-node service print --server https://HOST --swarm main --model tiny-mini --cpu-quota 100
    SAPO_TOKEN=... sapo-node service install --server https://HOST --model tiny-mini
    sapo-node service uninstall

Linux: a systemd user unit, ~/.config/systemd/user/sapo-node.service (Nice=, CPUQuota=, Restart=on-failure),
enabled and started with `systemctl --user`. macOS: a launchd agent, ~/Library/LaunchAgents/<LABEL>.plist
(Nice, ProcessType Background: launchd has no CPU quota), loaded with `launchctl`. Either runs
`sapo-node run --resume --out DIR` with the flags given here, so a restart continues the run.

The token never appears in the unit or its command line (`systemctl show` and `ps` print those to any
local user): install writes it to TOKEN_FILE, mode 0600, and the unit names the file in SAPO_TOKEN_FILE,
which `sapo-node run` reads (token_from_file refuses a file others may read).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import plistlib
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from sapo_node.token_file import token_from_file

UNIT = "sapo-node.service"
LABEL = "org.sapo-swarm.node"
#: Stop time a unit allows: the node finishes the step in progress and saves, which a real model takes minutes for.
STOP_SECONDS = 300
#: Pause before a restart after a failure.
RESTART_SECONDS = 30
#: `sapo-node run`'s exit status for a command it refuses (a bad flag, a missing token): restarting will not mend it.
USAGE_ERROR = 2
#: `sapo-node run`'s exit status when stopped by a signal: a stop, not a failure.
STOPPED = 130


def config_home() -> Path:
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")


def token_file() -> Path:
    return config_home() / "sapo-node" / "token"


def default_out() -> Path:
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "sapo-node" / "run"


def unit_path(system: str | None = None) -> Path:
    if (system or platform.system()) == "Darwin":
        return Path.home() / "Library" / "LaunchAgents" / f"{LABEL}.plist"
    return config_home() / "systemd" / "user" / UNIT


def write_token(token: str, path: Path) -> None:
    """Write `token` to `path` with mode 0600 from its first byte (its folder 0700)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an existing file keeps its old mode through O_CREAT
        os.write(fd, token.encode() + b"\n")
    finally:
        os.close(fd)


@dataclasses.dataclass(frozen=True)
class ServiceSpec:
    """What the unit runs and how: the `sapo-node run` argv (no token in it) and the limits."""

    argv: list[str]
    token_file: Path
    nice: int
    cpu_quota: int | None


def run_argv(run_flags: list[str], out: Path, threads: int | None) -> list[str]:
    """This interpreter running `sapo-node run` with the flags given, resumed in `out`; `threads`
    (from the CPU quota) unless the flags choose theirs."""
    argv = [sys.executable, "-m", "sapo_node", "run", *run_flags, "--resume", "--out", str(out)]
    if threads and "--threads" not in run_flags:
        argv += ["--threads", str(threads)]
    return argv


def systemd_unit(spec: ServiceSpec) -> str:
    lines = [
        "[Unit]",
        "Description=SAPO Swarm node (sapo-node run)",
        "After=network-online.target",
        "Wants=network-online.target",
        "",
        "[Service]",
        "Type=simple",
        f"ExecStart={' '.join(_systemd_quote(a) for a in spec.argv)}",
        f"Environment={_systemd_quote(f'SAPO_TOKEN_FILE={spec.token_file}')}",
        "Environment=PYTHONUNBUFFERED=1",
        f"Nice={spec.nice}",
    ]
    if spec.cpu_quota:
        lines.append(f"CPUQuota={spec.cpu_quota}%")
    lines += [
        "Restart=on-failure",
        f"RestartSec={RESTART_SECONDS}",
        f"RestartPreventExitStatus={USAGE_ERROR}",
        f"SuccessExitStatus={STOPPED}",
        f"TimeoutStopSec={STOP_SECONDS}",
        "",
        "[Install]",
        "WantedBy=default.target",
        "",
    ]
    return "\n".join(lines)


def launchd_plist(spec: ServiceSpec) -> bytes:
    log = Path.home() / "Library" / "Logs" / "sapo-node.log"
    return plistlib.dumps(
        {
            "Label": LABEL,
            "ProgramArguments": spec.argv,
            "EnvironmentVariables": {"SAPO_TOKEN_FILE": str(spec.token_file), "PYTHONUNBUFFERED": "1"},
            "RunAtLoad": True,
            "KeepAlive": {"SuccessfulExit": False},  # started again after a failure only
            "ThrottleInterval": RESTART_SECONDS,
            "ExitTimeOut": STOP_SECONDS,
            "Nice": spec.nice,
            "ProcessType": "Background",
            "StandardOutPath": str(log),
            "StandardErrorPath": str(log),
        }
    )


def _systemd_quote(word: str) -> str:
    """One word of a unit's command line: double-quoted when it holds anything systemd splits or
    expands ($ and % are doubled)."""
    word = word.replace("%", "%%").replace("$", "$$")
    if word and not any(c in word for c in " \t\"'\\;"):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


# ---------------------------------------------------------------------------- the command


def add_command(subparsers: Any) -> None:
    from sapo_node.cli import add_config_flags

    parser = subparsers.add_parser(
        "service",
        help="run the node as a user service (systemd on Linux, launchd on macOS): print, install, uninstall",
        description=__doc__.split("\n\n")[0] + " Flags other than the service's own go to `sapo-node run`.",
    )
    parser.add_argument("action", choices=["print", "install", "uninstall"])
    parser.add_argument("--nice", type=int, default=10, help="scheduling niceness, -20..19 (default: 10)")
    parser.add_argument(
        "--cpu-quota",
        type=int,
        default=None,
        metavar="PERCENT",
        help="CPU time the node may take, in percent of one core (200: two cores; systemd's CPUQuota); "
        "also its torch threads unless --threads is given (default: no cap)",
    )
    parser.add_argument(
        "--no-start",
        action="store_true",
        help="write or remove the files only; print the systemctl or launchctl commands instead of running them",
    )
    parser.add_argument(
        "--platform",
        choices=sorted(PLATFORMS),
        default=None,
        help="the service manager to write for: linux (systemd) or macos (launchd); default: this machine's",
    )
    add_config_flags(parser)
    parser.set_defaults(handler=service_command)


def spec_from_args(args: argparse.Namespace) -> tuple[ServiceSpec, list[str]]:
    """The service's spec and the `sapo-node run` flags it passes on (the config flags given, less
    --token, --out and --resume, which the service sets itself)."""
    from sapo_node.config import NodeConfig

    if not -20 <= args.nice <= 19:
        raise ValueError(f"--nice must be within -20..19, not {args.nice}")
    if args.cpu_quota is not None and args.cpu_quota <= 0:
        raise ValueError(f"--cpu-quota must be a positive percent, not {args.cpu_quota}")
    flags = []
    for f in dataclasses.fields(NodeConfig):
        if not hasattr(args, f.name) or f.name in ("token", "out", "resume"):
            continue
        value, flag = getattr(args, f.name), "--" + f.name.replace("_", "-")
        flags += [flag] if f.type == "bool" else [flag, str(value)]
    out = Path(getattr(args, "out", None) or default_out()).expanduser().absolute()
    threads = max(1, args.cpu_quota // 100) if args.cpu_quota else None
    spec = ServiceSpec(run_argv(flags, out, threads), token_file(), args.nice, args.cpu_quota)
    return spec, flags


#: --platform's choices, as platform.system() names them.
PLATFORMS = {"linux": "Linux", "macos": "Darwin"}


def service_command(args: argparse.Namespace) -> int:
    system = PLATFORMS[args.platform] if args.platform else platform.system()
    try:
        spec, flags = spec_from_args(args)
        if args.action != "uninstall" and "--offline" not in flags and "--server" not in flags:
            raise ValueError("give --server URL (the site to join), or --offline to train alone")
    except ValueError as exc:
        print(f"sapo-node service: error: {exc}", file=sys.stderr)
        return 2
    text = launchd_plist(spec).decode() if system == "Darwin" else systemd_unit(spec)
    if args.action == "print":
        print(text, end="")
        return 0
    if args.action == "uninstall":
        return uninstall(system, start=not args.no_start)
    return install(system, text, spec, token=getattr(args, "token", None), start=not args.no_start)


def install(system: str, text: str, spec: ServiceSpec, *, token: str | None, start: bool) -> int:
    token = token or os.environ.get("SAPO_TOKEN")
    if token:
        write_token(token, spec.token_file)
    elif "--offline" not in spec.argv:
        try:
            token_from_file(spec.token_file)
        except ValueError as exc:
            print(f"sapo-node service: error: no token: give --token or SAPO_TOKEN ({exc})", file=sys.stderr)
            return 2
    path = unit_path(system)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"wrote {path}; the token is read from {spec.token_file} (mode 600)")
    if system == "Darwin":
        commands = [["launchctl", "bootstrap", f"gui/{os.getuid()}", str(path)]]
    else:
        commands = [["systemctl", "--user", "daemon-reload"], ["systemctl", "--user", "enable", "--now", UNIT]]
    if _run_or_say(commands, run=start, say="to start it: ") != 0:
        return 1
    print(_logs_hint(system))
    return 0


def uninstall(system: str, *, start: bool) -> int:
    path = unit_path(system)
    if system == "Darwin":
        commands = [["launchctl", "bootout", f"gui/{os.getuid()}", str(path)]]
    else:
        commands = [["systemctl", "--user", "disable", "--now", UNIT]]
    status = _run_or_say(commands, run=start, say="to stop it: ") if path.exists() else 0
    path.unlink(missing_ok=True)
    token_file().unlink(missing_ok=True)
    if system != "Darwin" and status == 0:
        _run_or_say([["systemctl", "--user", "daemon-reload"]], run=start, say="then: ")
    print(f"removed {path} and {token_file()}; the run folder stays (sapo-node export takes its model)")
    return status


def _logs_hint(system: str) -> str:
    if system == "Darwin":
        return f"its output: {Path.home() / 'Library' / 'Logs' / 'sapo-node.log'}"
    return f"its output: journalctl --user -u {UNIT} -f; stop it: systemctl --user stop {UNIT}"


def _run_or_say(commands: list[list[str]], *, run: bool, say: str) -> int:
    """Run the service manager's commands, or print them after `say` when told not to run them or
    when the manager is missing (a container, another system)."""
    if run and shutil.which(commands[0][0]):
        for command in commands:
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                print(f"`{shlex.join(command)}` failed: {(done.stderr or done.stdout).strip()}", file=sys.stderr)
                return 1
        return 0
    print(say + " && ".join(shlex.join(c) for c in commands))
    return 0
