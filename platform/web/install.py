"""The commands that install and start the node client, per kind of machine, as /download/ and the
token box show them: one command a line, each line whole (a person copies them with the page's Copy
button or by hand), naming the swarm and the settings that kind of machine needs.

torch goes first, pinned, from the index that fits the machine: PyPI's Linux wheel is the CUDA build
(gigabytes of `nvidia-*` wheels), so a machine without an NVIDIA GPU takes PyTorch's CPU index. The
client then keeps the torch it finds (its requirement is a range) and gets the transformers it is
tested with.
"""

from __future__ import annotations

from dataclasses import dataclass

from swarms.models import Swarm, SwarmState

#: The versions the client is tested with: the Makefile's and the Dockerfile's torch, lock.txt's
#: transformers (tests/platform/test_download_commands.py holds them to those files).
TORCH_VERSION = "2.13.0"
TRANSFORMERS_VERSION = "5.23.0"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
#: In a command shown before the contributor has a token: a word a shell reads as it is (no `<`).
TOKEN_PLACEHOLDER = "YOUR_NODE_TOKEN"


@dataclass(frozen=True)
class Line:
    """One command. The swarm's slug is apart, so the page's swarm picker can rewrite it in place."""

    head: str
    swarm: str = ""
    tail: str = ""

    @property
    def text(self) -> str:
        return self.head + self.swarm + self.tail


@dataclass(frozen=True)
class Machine:
    key: str
    label: str
    note: str
    lines: tuple[Line, ...]

    @property
    def text(self) -> str:
        return "\n".join(line.text for line in self.lines)


def install_machines(*, wheel_url: str, ws_url: str, swarm: str | None, token: str | None = None) -> list[Machine]:
    """The install-and-run commands for a CPU machine (Linux, or Windows through WSL), an NVIDIA GPU
    and Apple silicon, in that order. `swarm` is the slug the run command names (None: the site's
    default swarm, no --swarm)."""
    run = f"SAPO_TOKEN={token or TOKEN_PLACEHOLDER} sapo-node run --server {ws_url}"

    def run_on(device: str) -> Line:
        if swarm:
            return Line(run + " --swarm ", swarm, f" --device {device}")
        return Line(run + f" --device {device}")

    client = Line(f"pip install transformers=={TRANSFORMERS_VERSION} {wheel_url}")
    venv = Line("python3 -m venv ~/sapo && . ~/sapo/bin/activate")
    return [
        Machine(
            key="cpu",
            label="CPU",
            note=(
                "Linux, or Windows through WSL (run `wsl --install` in PowerShell once, then `sudo apt install "
                "python3-venv` in Ubuntu). torch's CPU build is a small download. The node takes the cores other work leaves idle "
                "(its first line says how many; --threads overrides)."
            ),
            lines=(
                venv,
                Line(f"pip install torch=={TORCH_VERSION} --index-url {TORCH_CPU_INDEX}"),
                client,
                run_on("cpu"),
            ),
        ),
        Machine(
            key="cuda",
            label="NVIDIA GPU",
            note=(
                "Linux with an NVIDIA driver: PyPI's torch for Linux is the CUDA build. Check with "
                '`python -c "import torch; print(torch.cuda.is_available())"`.'
            ),
            lines=(venv, Line(f"pip install torch=={TORCH_VERSION}"), client, run_on("cuda")),
        ),
        Machine(
            key="mps",
            label="Apple silicon",
            note="macOS on an M-series Mac: torch trains on its GPU through MPS.",
            lines=(
                Line("python3 -m venv ~/sapo && source ~/sapo/bin/activate"),
                Line(f"pip install torch=={TORCH_VERSION}"),
                client,
                run_on("mps"),
            ),
        ),
    ]


def install_swarms(*, chosen: str | None) -> tuple[list[Swarm], Swarm | None]:
    """The open swarms a command may name (default first) and the one it names: `chosen` when it is
    open, else the site's default when open, else the first open one (None: the site has none open)."""
    swarms = sorted(Swarm.objects.filter(state=SwarmState.OPEN), key=lambda s: (not s.is_default, s.slug))
    by_slug = {s.slug: s for s in swarms}
    if chosen and chosen in by_slug:
        return swarms, by_slug[chosen]
    return swarms, (swarms[0] if swarms else None)
