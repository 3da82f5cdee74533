"""The built-in models prebuilt by the site, and their checked download into the node cache.

A node's first run of a built-in model (`--model tiny-mini`, `tiny`, ...) would build it: train a
tokenizer and warm-start the model, minutes on an idle laptop, up to an hour on a busy one. A site
builds each of them once instead (`manage.py sapo_models build`, with the same builder:
sapo_node.tiny.cache.load_tiny, seed 0) and serves

    GET /models/manifest.json          the Manifest below
    GET /models/<folder>/<file>        each file of a model, with its Content-Length

where <folder> is the cache folder's own name (`tiny-mini-<recipe digest[:12]>`), so the site's
folder of prebuilt models is laid out as a node cache.

A node whose cache lacks the model asks the site it was told to join (`--server`) and takes its
copy only when all of this holds, else it says why and builds the model itself:
- the manifest's entry has the recipe digest this client computes itself (tiny.recipe.recipe_digest: the
  variant's fields, seed, steps, the task catalogue, the prompt format, tiny.recipe.RECIPE_VERSION), so a
  client only takes the model its own recipe would build;
- every file has the declared size and sha256;
- the files' build.json records that recipe, config.json the variant's architecture, and
  tokenizer.json is the tokenizer the recipe trains (the client trains it again: a quarter of a
  second), which is what an audit depends on: the site's audit worker rebuilds the architecture and
  tokenizer and replays with the node's uploaded weights (docs/audits.md), not the base weights.
The files are written in a staging folder beside the cache folder and renamed into place once all
are checked: a failed, refused or interrupted download keeps nothing (sapo_node.tiny.cache.load_tiny
removes what a killed one left, under the model's lock).

No Django: the site's app `prebuilt` imports the Manifest from here, so both sides read one shape.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import shutil
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit

import msgspec

from sapo_node import __version__
from sapo_node.proof import file_sha256

MANIFEST_PATH = "/models/manifest.json"
MODELS_PATH = "/models/"
MANIFEST_FORMAT = 1
#: Bounds on what a node reads from a site: the manifest's bytes, files per model, a model's bytes.
MAX_MANIFEST_BYTES = 1 << 20
MAX_FILES = 16
MAX_MODEL_BYTES = 2 << 30
#: A folder or file name: one path component, no dot first (no "..", no hidden file).
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
#: The files a model folder must hold (tiny.cache.load_tiny's build writes them).
REQUIRED = ("build.json", "config.json", "model.safetensors", "tokenizer.json")
#: Seconds a read from the site may stall; connection attempts (the site still starting, as under
#: `make run`) and the pause between them.
TIMEOUT = 30.0
ATTEMPTS = 4
RETRY_PAUSE = 2.0
READ_CHUNK = 1 << 20


class ManifestFile(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: str
    size: int
    sha256: str


class ManifestModel(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    #: The built-in model's name (sapo_node.tiny.variants.VARIANTS), its recipe's sha256, its folder's name.
    name: str
    recipe: str
    folder: str
    files: list[ManifestFile]


class Manifest(msgspec.Struct, kw_only=True):
    format: int
    models: list[ManifestModel]


class PrebuiltUnavailable(Exception):
    """The site has no usable prebuilt copy of the model; the message says why."""


def parse_manifest(data: bytes) -> Manifest:
    """The manifest, its names and sizes checked (a site's bytes are untrusted); raises
    PrebuiltUnavailable."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise PrebuiltUnavailable(f"its manifest is over {MAX_MANIFEST_BYTES} bytes")
    try:
        manifest = msgspec.json.decode(data, type=Manifest)
    except msgspec.DecodeError as exc:
        raise PrebuiltUnavailable(f"its manifest is not one this client reads ({exc})") from None
    if manifest.format != MANIFEST_FORMAT:
        raise PrebuiltUnavailable(f"its manifest has format {manifest.format}, this client reads {MANIFEST_FORMAT}")
    for model in manifest.models:
        names = [f.name for f in model.files]
        if not (NAME.match(model.folder) and SHA256.match(model.recipe)) or len(names) > MAX_FILES:
            raise PrebuiltUnavailable(f"its manifest's entry for {model.name!r} is malformed")
        if len(set(names)) != len(names) or not all(NAME.match(n) for n in names):
            raise PrebuiltUnavailable(f"its manifest's entry for {model.name!r} names files badly")
        if any(not SHA256.match(f.sha256) or f.size < 0 for f in model.files):
            raise PrebuiltUnavailable(f"its manifest's entry for {model.name!r} has a bad size or sha256")
        if sum(f.size for f in model.files) > MAX_MODEL_BYTES:
            raise PrebuiltUnavailable(f"its {model.name} is over {MAX_MODEL_BYTES} bytes")
    return manifest


def describe_folder(name: str, recipe: str, folder: Path) -> ManifestModel:
    """The manifest's entry for a finished model folder (the site's side)."""
    files = [
        ManifestFile(name=p.name, size=p.stat().st_size, sha256=file_sha256(p))
        for p in sorted(folder.iterdir())
        if p.is_file() and NAME.match(p.name)
    ]
    return ManifestModel(name=name, recipe=recipe, folder=folder.name, files=files)


def site_origin(server: str) -> str:
    """http(s)://host[:port] of the site a node's --server names (any form sapo-node run takes:
    sapo_node.transport.node_endpoint)."""
    parts = urlsplit(server.strip())
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    if scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"--server must be a ws://, wss://, http:// or https:// address, not {server!r}")
    return f"{scheme}://{parts.netloc}"


# ---------------------------------------------------------------------------- the node's side


def fetcher(server: str, variant: str, *, seed: int = 0, steps: int | None = None, out: TextIO | None = None):
    """`fetch` for tiny.cache.load_tiny: places the site's prebuilt copy at the path it is given and returns
    True, or says on `out` (default stderr) why it cannot and returns False (the caller builds)."""

    def fetch(path: Path) -> bool:
        stream = out if out is not None else sys.stderr
        try:
            origin = site_origin(server)
        except ValueError as exc:
            print(f"no prebuilt {variant}: {exc}; building it here", file=stream, flush=True)
            return False
        try:
            download(origin, variant, path, seed=seed, steps=steps, out=stream)
        except PrebuiltUnavailable as exc:
            print(f"no prebuilt {variant} from {origin}: {exc}; building it here", file=stream, flush=True)
            return False
        return True

    return fetch


def download(origin: str, variant: str, path: Path, *, seed: int = 0, steps: int | None = None, out: TextIO) -> None:
    """Download the site's `variant` into `path` (which must not exist yet), checked as the module
    docstring says; raises PrebuiltUnavailable and leaves nothing when it cannot."""
    from sapo_node.tiny.cache import staging_dir
    from sapo_node.tiny.recipe import recipe_digest

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # as the node's socket: no proxy
    manifest = parse_manifest(_get_manifest(opener, origin + MANIFEST_PATH))
    recipe = recipe_digest(variant, seed, steps)
    entries = [m for m in manifest.models if m.name == variant]
    if not entries:
        raise PrebuiltUnavailable(f"the site publishes no {variant}")
    entry = next((m for m in entries if m.recipe == recipe), None)
    if entry is None or entry.folder != path.name:
        raise PrebuiltUnavailable(
            f"the site's {variant} is of another recipe than this client's (sapo-node {__version__}): "
            "the site or this client is of another version"
        )
    names = {f.name for f in entry.files}
    if missing := [n for n in REQUIRED if n not in names]:
        raise PrebuiltUnavailable(f"its {variant} lacks {', '.join(missing)}")
    total = sum(f.size for f in entry.files)
    staging = staging_dir(path)
    parts = partial_dir(path)
    try:
        _download_files(
            opener, f"{origin}{MODELS_PATH}{entry.folder}/", entry.files, staging, parts, total, variant, out
        )
        check_model_folder(staging, variant, seed=seed, steps=steps)
        if path.exists():  # a folder without build.json: not a finished model (the caller holds the lock)
            shutil.rmtree(path)
        staging.rename(path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        with contextlib.suppress(OSError):
            parts.rmdir()  # when no cut download's part is left in it


def partial_dir(path: Path) -> Path:
    """Where the parts of `path`'s files that a cut download left wait to be resumed: each named for
    its file and the sha256 the manifest gives it (`model.safetensors.<sha256>.part`), so a part is
    only ever resumed toward that same file, and taken only once the whole file has that sha256. Its
    name is not a staging folder's (tiny.cache.drop_stale_staging keeps it)."""
    return path.parent / f".partial-{path.name}"


def check_model_folder(folder: Path, variant: str, *, seed: int = 0, steps: int | None = None) -> None:
    """Raise PrebuiltUnavailable unless the folder's build.json records this client's recipe, its
    config.json the variant's architecture and its tokenizer.json the tokenizer the recipe trains."""
    from tokenizers import Tokenizer

    from sapo_node.tiny.recipe import recipe
    from sapo_node.tiny.tokenizer import train_tokenizer
    from sapo_node.tiny.variants import get_variant

    spec = get_variant(variant)
    want = recipe(spec, seed, spec.steps if steps is None else steps)
    try:
        info = json.loads((folder / "build.json").read_text())
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise PrebuiltUnavailable(f"its {variant} build.json or config.json does not load ({exc})") from None
    try:
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    except Exception as exc:  # the tokenizers library raises a bare Exception for a file it cannot read
        raise PrebuiltUnavailable(f"its {variant} tokenizer.json does not load ({str(exc)[:200]})") from None
    if not isinstance(info, dict) or info.get("recipe") != json.loads(json.dumps(want)):
        raise PrebuiltUnavailable(f"its {variant} build.json records another recipe")
    architecture = {
        "model_type": "qwen2",
        "hidden_size": spec.hidden_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "intermediate_size": spec.intermediate_size,
        "tie_word_embeddings": True,
    }
    if not isinstance(config, dict) or any(config.get(k) != v for k, v in architecture.items()):
        raise PrebuiltUnavailable(f"its {variant} config.json is not the variant's architecture")
    if tokenizer.to_str() != train_tokenizer(spec).backend_tokenizer.to_str():
        raise PrebuiltUnavailable(f"its {variant} tokenizer is not the one this client's recipe trains")


def _open(opener: urllib.request.OpenerDirector, url: str, headers: dict[str, str] | None = None):
    """The response for GET `url`, retrying a refused or failed connection (a site still starting)."""
    request = urllib.request.Request(url, headers={"User-Agent": f"sapo-node/{__version__}", **(headers or {})})
    for attempt in range(ATTEMPTS):
        try:
            return opener.open(request, timeout=TIMEOUT)
        except urllib.error.HTTPError as exc:
            exc.close()
            if exc.code == 416:
                raise _BrokeOff("the site cannot serve the rest of the part kept (416)") from None
            if exc.code == 404:
                raise PrebuiltUnavailable("the site serves no prebuilt models (404)") from None
            raise PrebuiltUnavailable(f"the site answered {exc.code} for {url}") from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            if attempt + 1 == ATTEMPTS:
                reason = getattr(exc, "reason", exc)
                raise PrebuiltUnavailable(f"cannot reach the site ({reason})") from None
            time.sleep(RETRY_PAUSE)
    raise AssertionError("unreachable")


def _get_manifest(opener: urllib.request.OpenerDirector, url: str) -> bytes:
    with _open(opener, url) as response:
        try:
            return response.read(MAX_MANIFEST_BYTES + 1)
        except (OSError, http.client.HTTPException) as exc:
            raise PrebuiltUnavailable(f"its manifest's download failed ({exc})") from None


class _BrokeOff(Exception):
    """A file's download stopped before its end: resumed from what came, a few times."""


def _download_files(
    opener: urllib.request.OpenerDirector,
    base: str,
    files: list[ManifestFile],
    staging: Path,
    parts: Path,
    total: int,
    variant: str,
    out: TextIO,
) -> None:
    """Each file into `staging`, through its part in `parts`: a connection that breaks off is
    resumed from the part's end (ATTEMPTS times in a row), and a part a cut run left is resumed too."""
    from sapo_node.progress import progress_bar

    parts.mkdir(exist_ok=True)
    with progress_bar(total=total / 1e6, desc=f"downloading {variant}", unit="MB", file=out) as bar:
        for f in files:
            part = parts / f"{f.name}.{f.sha256}.part"
            for other in parts.glob(f"{f.name}.*.part"):  # a part of another copy of the file: useless
                if other != part:
                    other.unlink()
            if part.exists():  # left by a cut run: what it holds counts as done
                bar.update(min(part.stat().st_size, f.size) / 1e6)
            for attempt in range(ATTEMPTS):
                try:
                    _fetch_part(opener, base + f.name, f, part, bar)
                    break
                except _BrokeOff as exc:
                    if attempt + 1 == ATTEMPTS:
                        raise PrebuiltUnavailable(f"{f.name}: the download broke off ({exc})") from None
                    time.sleep(RETRY_PAUSE)
            if file_sha256(part) != f.sha256:  # a part is trusted only as far as the whole file's checksum
                part.unlink()
                raise PrebuiltUnavailable(f"{f.name}: its sha256 is not the manifest's")
            os.replace(part, staging / f.name)


def _fetch_part(opener: urllib.request.OpenerDirector, url: str, f: ManifestFile, part: Path, bar: Any) -> None:
    """Bring `part` to `f.size` bytes: the rest of it (a 206 for `Range`, only while the site's file
    is still the one its ETag names) or the whole file again (a 200). Raises _BrokeOff when fewer
    bytes came, PrebuiltUnavailable when the site sends what its manifest does not say."""
    have = part.stat().st_size if part.exists() else 0
    if have > f.size:
        part.unlink()
        have = 0
    if have == f.size:
        return
    headers = {"Range": f"bytes={have}-", "If-Range": f'"{f.sha256}"'} if have else {}
    try:
        response = _open(opener, url, headers)
    except _BrokeOff:
        part.unlink(missing_ok=True)  # the site's file is shorter than the part: start again
        raise
    with response:
        if response.status == 206:
            expected = f"bytes {have}-{f.size - 1}/{f.size}"
            if response.headers.get("Content-Range") != expected:
                raise PrebuiltUnavailable(
                    f"{f.name}: the site sends {response.headers.get('Content-Range')}, not {expected}"
                )
            mode = "ab"
        else:
            have, mode = 0, "wb"
        length = response.headers.get("Content-Length")
        if length is not None and length.strip() != str(f.size - have):
            due = f"{f.size - have} were due from byte {have}" if have else f"its manifest says {f.size}"
            raise PrebuiltUnavailable(f"{f.name}: the site sends {length} bytes, {due}")
        received, want = 0, f.size - have
        with open(part, mode) as sink:
            while received <= want:
                try:
                    chunk = response.read(min(READ_CHUNK, want + 1 - received))
                except (OSError, http.client.HTTPException) as exc:
                    raise _BrokeOff(str(exc)) from None
                if not chunk:
                    break
                received += len(chunk)
                sink.write(chunk)
                bar.update(len(chunk) / 1e6)
    if received > want:
        part.unlink()
        raise PrebuiltUnavailable(f"{f.name}: more bytes came than its manifest says ({f.size})")
    if received < want:
        raise _BrokeOff(f"{have + received} of {f.size} bytes")
