"""The pinned packages a GPU machine needs for the research harness (`python -m research`) besides
what it already has.

    .venv/bin/python deploy/gpu/requirements.py [--without NAME ...] > var/gpu-wheels/requirements.txt

Walks the dependencies of the platform (requirements/base.txt) and of the study (the node client and
its `experiment` and `smollm2` extras) through this environment's installed distributions, with markers evaluated
for the target Python (3.12, Linux x86-64), and prints `name==version` for each one. What the machine
already has is left out with everything only it needs: torch and transformers (and their
dependencies: CUDA, tokenizers, safetensors, the hub client); so is pycosat, which has no cp312 wheel
(reasoning-gym imports it at import, for its zebra puzzles): study.sh carries its source and compiles
it there. A package that torch or
transformers needs is taken from the machine, never shadowed by another version. scipy is left out
too (the analysis only: the study's rows are analysed where it is installed), and `--without NAME
...` leaves out packages the machine is known to have, to fit what can be carried to it.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
#: Installed on the GPU machine already, with their own dependencies.
PROVIDED = {"torch", "transformers"}
#: No wheel for the target: study.sh carries its source instead.
NO_WHEEL = {"pycosat"}
#: The analysis only (35 MB): the runs' rows come back and are analysed where scipy is installed.
ANALYSIS_ONLY = {"scipy"}
#: sapo-node's extras a study needs: the analysis, and reading the GGUF file of smollm2-135m.
EXTRAS = ("experiment", "smollm2")
TARGET = {
    "python_version": "3.12",
    "python_full_version": "3.12.0",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "os_name": "posix",
}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def roots() -> list[Requirement]:
    lines = (ROOT / "requirements" / "base.txt").read_text().splitlines()
    found = [Requirement(line.split("#")[0].strip()) for line in lines if line.split("#")[0].strip()]
    node = metadata.distribution("sapo-node")
    for text in node.requires or []:
        req = Requirement(text)
        if req.marker is None or any(req.marker.evaluate({**TARGET, "extra": extra}) for extra in EXTRAS):
            found.append(Requirement(f"{req.name}{req.specifier}"))  # the extra's marker is settled here
    return found


def closure(
    start: list[Requirement] | None = None, skip: set[str] | None = None, without: tuple[str, ...] = ()
) -> dict[str, str]:
    """{name: installed version} of every distribution `start` (default: roots()) needs, except `skip`
    (default: PROVIDED and NO_WHEEL and everything PROVIDED needs: the machine has those)."""
    if skip is None:
        provided = closure([Requirement(n) for n in PROVIDED], set())
        skip = {canonical(n) for n in NO_WHEEL | ANALYSIS_ONLY} | set(provided)
        skip |= {canonical(n) for n in without}
    pinned: dict[str, str] = {}
    todo = [(req, "") for req in (roots() if start is None else start)]
    while todo:
        req, extra = todo.pop()
        name = canonical(req.name)
        if name in skip or (req.marker is not None and not req.marker.evaluate({**TARGET, "extra": extra})):
            continue
        first = name not in pinned
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            sys.exit(f"{req.name} is needed but not installed here: run `make venv` first")
        pinned[name] = dist.version
        for text in dist.requires or []:
            child = Requirement(text)
            for want in req.extras or {""}:
                if child.marker is None or child.marker.evaluate({**TARGET, "extra": want}):
                    if first or req.extras:
                        todo.append((child, want))
                    break
    pinned.pop("sapo-node", None)
    return dict(sorted(pinned.items()))


if __name__ == "__main__":
    given = sys.argv[1:]
    if given and given[0] != "--without":
        sys.exit("usage: requirements.py [--without NAME ...]")
    for name, version in closure(without=tuple(given[1:])).items():
        print(f"{name}=={version}")
