"""The node client's wheel, built by the site from node_client/ (never committed as a binary).

Built on first request into VAR_DIR/dist/<hash>/ with `pip wheel --no-deps --no-build-isolation`,
where <hash> is the SHA-256 of node_client's source files: an edited client gets a new wheel, an
unchanged one is built once per deployment (the Docker image may prebuild it with
`python manage.py sapo_wheel`). A file lock keeps concurrent requests and processes from building
twice; the build happens in a temporary copy so it never writes into the source tree.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from filelock import FileLock

from common.errors import ApplicationError
from sapo_node.proof import file_sha256

SOURCE_DIR = Path(settings.BASE_DIR) / "node_client"
_SKIP_DIRS = {"__pycache__", "build", "dist", ".pytest_cache"}
_VERSION_RE = re.compile(r"""^__version__\s*=\s*["']([^"']+)["']""", re.MULTILINE)
BUILD_TIMEOUT_SECONDS = 300
PRUNE_AFTER_SECONDS = 3600
_BUILD_ID_RE = re.compile(r"^[0-9a-f]{16}$")
_FILENAME_RE = re.compile(r"^sapo_node-[A-Za-z0-9_.+]+-py3-none-any\.whl$")


@dataclass(frozen=True)
class Wheel:
    path: Path
    version: str
    sha256: str
    size: int

    @property
    def filename(self) -> str:
        return self.path.name

    @property
    def build_id(self) -> str:
        """The source hash prefix naming this build (its folder): download URLs carry it, so a URL
        always names exactly the bytes whose SHA-256 the page showed."""
        return self.path.parent.name


def _source_files() -> list[Path]:
    files = []
    for path in sorted(SOURCE_DIR.rglob("*")):
        relative = path.relative_to(SOURCE_DIR)
        if not path.is_file() or any(p in _SKIP_DIRS or p.endswith(".egg-info") for p in relative.parts):
            continue
        if path.suffix in {".pyc", ".pyo"}:
            continue
        files.append(path)
    return files


def source_hash() -> str:
    digest = hashlib.sha256()
    for path in _source_files():
        digest.update(str(path.relative_to(SOURCE_DIR)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def client_version() -> str:
    match = _VERSION_RE.search((SOURCE_DIR / "sapo_node" / "__init__.py").read_text())
    return match.group(1) if match else "0"


def _describe(path: Path) -> Wheel:
    sha_file = path.with_suffix(".sha256")
    if sha_file.exists():
        sha = sha_file.read_text().split()[0]
    else:
        sha = file_sha256(path)
        sha_file.write_text(f"{sha}  {path.name}\n")
    version = path.name.split("-")[1]
    return Wheel(path=path, version=version, sha256=sha, size=path.stat().st_size)


def _build(out_dir: Path) -> Path:
    with tempfile.TemporaryDirectory(prefix="sapo-wheel-") as tmp:
        src = Path(tmp) / "node_client"
        for path in _source_files():
            target = src / path.relative_to(SOURCE_DIR)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
        readme = src / "README.md"
        if not readme.exists():  # pyproject names a readme; the wheel must build without one too
            readme.write_text("# sapo-node\n\nA SAPO swarm node. See the swarm's /download/ page.\n")
        staging = Path(tmp) / "out"
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--no-build-isolation",
                "--no-cache-dir",
                "--disable-pip-version-check",
                "-q",
                "-w",
                str(staging),
                str(src),
            ],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_SECONDS,
            check=False,
        )
        wheels = list(staging.glob("sapo_node-*.whl"))
        if result.returncode != 0 or len(wheels) != 1:
            raise ApplicationError(
                "wheel_build_failed", f"building the node client failed: {result.stderr[-2000:]}", status=503
            )
        out_dir.mkdir(parents=True, exist_ok=True)
        final = out_dir / wheels[0].name
        shutil.move(str(wheels[0]), final)
        return final


def wheel_get() -> Wheel:
    """The current client's wheel, building it first if this source hash has none yet."""
    out_dir = Path(settings.VAR_DIR) / "dist" / source_hash()[:16]
    existing = sorted(out_dir.glob("sapo_node-*.whl"))
    if existing:
        return _describe(existing[0])
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out_dir) + ".lock", timeout=BUILD_TIMEOUT_SECONDS):
        existing = sorted(out_dir.glob("sapo_node-*.whl"))  # built by whoever held the lock
        if existing:
            return _describe(existing[0])
        wheel = _describe(_build(out_dir))
    _prune(keep=out_dir)
    return wheel


def _prune(*, keep: Path) -> None:
    """Remove the wheels of older sources, once they are a while old (a page that showed one may
    still be followed; an open download keeps its file)."""
    cutoff = time.time() - PRUNE_AFTER_SECONDS
    for old in keep.parent.iterdir():
        if old.is_dir() and old != keep and old.stat().st_mtime < cutoff:
            shutil.rmtree(old, ignore_errors=True)


def wheel_find(*, build_id: str, filename: str) -> Wheel | None:
    """A wheel built earlier (this or an older source), or None when it is not (or no longer) here."""
    if not _BUILD_ID_RE.match(build_id) or not _FILENAME_RE.match(filename):
        return None
    path = Path(settings.VAR_DIR) / "dist" / build_id / filename
    return _describe(path) if path.is_file() else None
