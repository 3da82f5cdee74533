"""Every function of the C extension (native/, `sapo_native`) against its twin, on random and hostile
inputs, under AddressSanitizer and UBSan.

    .venv/bin/python bench/native_fuzz.py --seconds 600            # the long run (docs/benchmarks.md)
    .venv/bin/python bench/native_fuzz.py --seconds 5 --seed 7     # tests/platform/test_native_fuzz.py
    .venv/bin/python bench/native_fuzz.py --installed --seconds 10 # the installed build, no sanitizers

The extension is built from native/sapo_native/_text.c with `-fsanitize=address,undefined
-fno-sanitize-recover=all` into a temporary folder, and this script runs again on that build with
ASan's runtime preloaded (Python itself is not instrumented; leaks are not checked: the interpreter
keeps its own on purpose). A sanitizer report aborts the run with its trace.

Each round draws (from `--seed` and the round's number, so a failure is repeated with the same two)
texts over an alphabet of ASCII whitespace, controls, NUL, non-ASCII and lone surrogates, and:
- compares normalise_ascii, char_counts, simhashes and answers with their twins
  (moderation.kernels' numpy and Python ones, sapo_node's extract_answer), exact_first and near_first
  through filters.CopyIndex with and without the extension (and exact_first with its definition),
  and pg_array with psycopg's own binary dumper of the same list, for every element kind;
- calls each with a list that Python code empties or shrinks while the call runs (a garbage collector
  finalizer, a uuid whose `int` does it) and with elements of the wrong types: an answer or a clean
  exception, never a crash.
Exit status 0: every round agreed. Otherwise the first disagreement is printed with its seed and round.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SANITIZE = ["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined", "-fno-sanitize-recover=all"]

#: ASCII whitespace str.split() knows, controls, NUL, wide and zero-width characters, BOM, astral, a
#: full-width letter, lone surrogates (the C functions take any str), and the answer tags' pieces.
ALPHABET = (
    list("abcxyzABCXYZ0189<>/.,")
    + [" ", "\t", "\n", "\x0b", "\x0c", "\r", "\x1c", "\x1d", "\x1e", "\x1f", "\x00", "\x07", "\x7f"]
    + ["é", "数", "\u200b", "\ufeff", "\u202e", "\U0001f600", "Ａ", "\x85", "\u2028", "\ud800", "\udfff"]
    + ["<answer>", "</answer>", "<answer", "answer>"]
)
LENGTHS = [0, 1, 3, 4, 5, 9, 254, 258, 259, 600, 3999, 4003, 4100]


class Text(str):
    """A str subclass: the C functions take them as str."""


class Data(bytes):
    """A bytes subclass."""


class Number(int):
    """An int subclass."""


class Disagreement(AssertionError):
    pass


def agree(name: str, mine: object, twin: object) -> None:
    if mine != twin:
        raise Disagreement(f"{name}: C {mine!r:.300} != twin {twin!r:.300}")


def texts_of(rng: random.Random, n: int, *, ascii_only: bool = False) -> list[str]:
    alphabet = [c for c in ALPHABET if c.isascii()] if ascii_only else ALPHABET
    out: list[str] = []
    for _ in range(n):
        length = rng.choice(LENGTHS)
        if rng.random() < 0.3:  # runs of one character (repeats, long whitespace)
            text = "".join(rng.choice(alphabet) * rng.randint(1, 40) for _ in range(length // 20 + 1))
        else:
            text = "".join(rng.choices(alphabet, k=length))
        out.append(Text(text) if rng.random() < 0.1 else text)
    return out


# --- the rounds -------------------------------------------------------------------------------------


def text_functions(rng: random.Random, fast, filters, kernels, extract_answer) -> None:
    import numpy as np

    texts = texts_of(rng, rng.randint(0, 48), ascii_only=rng.random() < 0.5)
    agree("normalise_ascii", fast.normalise_ascii(texts), kernels.normalised_ascii_numpy(texts))
    counts = np.frombuffer(fast.char_counts(texts), dtype="<i8").reshape(len(texts), 4).T
    agree("char_counts", counts.tolist(), np.array(kernels.char_counts_numpy(texts)).reshape(4, len(texts)).tolist())
    agree("answers", fast.answers(texts), [extract_answer(t) for t in texts])
    datas = [t[: filters.SIMHASH_CHARS].encode("utf-8", "surrogatepass") for t in texts]
    datas = [Data(d) if rng.random() < 0.1 else d for d in datas]
    agree(
        "simhashes",
        np.frombuffer(fast.simhashes(datas), dtype="<i8").tolist(),
        kernels.simhashes_numpy(datas).tolist(),
    )


def copy_lookups(rng: random.Random, fast, filters, kernels) -> None:
    """exact_first and near_first through CopyIndex, with the extension and without (its numpy twin),
    one group per candidate completion; digests and simhashes from small pools, so that probes find
    candidates, share their first 8 bytes or their bands."""
    prefixes = [os.urandom(8) for _ in range(rng.randint(1, 4))]
    pool = [rng.choice(prefixes) + os.urandom(8) if rng.random() < 0.7 else os.urandom(16) for _ in range(40)]
    n = rng.randint(0, 300)
    candidates = [rng.choice(pool) for _ in range(n)]
    probes = [rng.choice(pool) for _ in range(rng.randint(0, 60))]
    base = [rng.getrandbits(64) for _ in range(8)]
    hashes = [(rng.choice(base) ^ (1 << rng.randrange(64)) * (rng.random() < 0.5)) for _ in range(n)]
    probe_hashes = [rng.choice(base) ^ rng.getrandbits(64) * (rng.random() < 0.2) for _ in range(rng.randint(0, 40))]
    signed = [h - (1 << 64) if h >= 1 << 63 else h for h in probe_hashes]

    exact = b"".join(candidates)
    first: dict[bytes, int] = {}
    for c, digest in enumerate(candidates):
        first.setdefault(digest, c)
    agree("exact_first", fast.exact_first(exact, b"".join(probes)), [first.get(p, -1) for p in probes])

    ids = b"".join(uuid.UUID(int=c + 1).bytes for c in range(n))
    packed = b"".join(h.to_bytes(8, "big") for h in hashes)
    index = filters.CopyIndex(ids, [1] * n, exact, packed)
    distance = rng.randint(0, 64)
    kernels.native = lambda: fast
    try:
        mine = (index.exact_matches(probes), index.near_matches(signed, distance))
    finally:
        kernels.native = lambda: None
    agree("exact_first (CopyIndex)", mine[0], index.exact_matches(probes))
    agree("near_first (CopyIndex)", mine[1], index.near_matches(signed, distance))


ARRAY_KINDS = {
    "text": (0, 25, 1009),
    "bytea": (1, 17, 1001),
    "int4": (2, 23, 1007),
    "int8": (3, 20, 1016),
    "bool": (4, 16, 1000),
    "uuid": (5, 2950, 2951),
}


def array_values(rng: random.Random, kind: str, n: int) -> list:
    def one():
        if rng.random() < 0.15:
            return None
        if kind == "text":
            return (
                rng.choice(texts_of(rng, 1, ascii_only=rng.random() < 0.5)).replace("\ud800", "").replace("\udfff", "")
            )
        if kind == "bytea":
            return Data(os.urandom(rng.choice(LENGTHS))) if rng.random() < 0.1 else os.urandom(rng.choice(LENGTHS))
        if kind in ("int4", "int8"):
            bits = 31 if kind == "int4" else 63
            x = rng.choice([0, 1, -1, (1 << bits) - 1, -(1 << bits), rng.randrange(-(1 << bits), 1 << bits)])
            return Number(x) if rng.random() < 0.1 else x
        if kind == "bool":
            return rng.random() < 0.5
        return uuid.UUID(int=rng.choice([0, (1 << 128) - 1, rng.getrandbits(128)]))

    return [one() for _ in range(n)]


def arrays(rng: random.Random, fast) -> None:
    """pg_array against psycopg's binary dumper of the same list, for the array type (its twin: without
    the extension, psycopg dumps the list itself)."""
    import psycopg
    from psycopg.adapt import Transformer
    from psycopg.pq import Format

    kind = rng.choice(list(ARRAY_KINDS))
    code, element_oid, array_oid = ARRAY_KINDS[kind]
    values = array_values(rng, kind, rng.randint(0, 40))
    dumper = psycopg.adapters.get_dumper_by_oid(array_oid, Format.BINARY)(list, Transformer())
    agree(f"pg_array {kind}", fast.pg_array(code, element_oid, values), bytes(dumper.dump(values)))


def hostile(rng: random.Random, fast) -> None:
    """Lists changed by Python code while a call reads them, and elements of the wrong types: the call
    answers (from the list as it was when called) or raises a clean exception."""
    function = rng.choice(["normalise_ascii", "char_counts", "answers", "simhashes", "pg_array"])
    n = rng.randint(1, 200)
    if function == "simhashes":
        items: list = [os.urandom(rng.choice(LENGTHS)) for _ in range(n)]
    elif function == "pg_array":
        items = array_values(rng, "uuid", n)
    else:
        items = texts_of(rng, n)
    target = list(items)
    how = rng.choice(["finalizer", "uuid int", "wrong type"])
    if how == "wrong type":
        target.insert(rng.randrange(len(target) + 1), rng.choice([None, 1, 1.5, b"x", "x", object(), True, 2**200]))
        call = (lambda: fast.pg_array(rng.randrange(6), 25, target)) if function == "pg_array" else None
        try:
            (call or (lambda: getattr(fast, function)(target)))()
        except (TypeError, ValueError, OverflowError, UnicodeEncodeError):
            pass
        return
    if how == "uuid int" and function == "pg_array":
        action = rng.choice(["clear", "shrink", "grow", "raise", "not an int", "huge", "negative"])

        class Sneaky:
            @property
            def int(self):
                if action == "clear":
                    target.clear()
                elif action == "shrink":
                    del target[: len(target) // 2]
                elif action == "grow":
                    target.extend(uuid.uuid4() for _ in range(1000))
                elif action == "raise":
                    raise RuntimeError("no int")
                return {"not an int": "5", "huge": 1 << 130, "negative": -1}.get(action, 5)

        target.insert(rng.randrange(len(target) + 1), Sneaky())
        try:
            out = fast.pg_array(5, 2950, target)
        except (TypeError, OverflowError, RuntimeError):
            return
        if len(out) != 20 + 20 * n + 20 - sum(16 for v in items if v is None):
            raise Disagreement(f"pg_array read a list that changed: {len(out)} bytes for {n + 1} items")
        return
    # A finalizer that empties the list, run by the garbage collector at the call's first allocation.
    chosen = getattr(fast, function)
    call = (lambda: chosen(5, 2950, target)) if function == "pg_array" else (lambda: chosen(target))

    class Clearer:
        def __del__(self):
            target.clear()

    def garbage() -> None:
        loop = Clearer()
        loop.self = loop

    threshold = gc.get_threshold()
    gc.collect()
    gc.disable()
    garbage()
    gc.set_threshold(1)
    gc.enable()
    try:
        out = call()
    finally:
        gc.set_threshold(*threshold)
    if isinstance(out, list) and len(out) != n:
        raise Disagreement(f"{function}: {len(out)} answers for the {n} texts it was called with")


def run(seconds: float, seed: int, rounds: int | None) -> int:
    import django
    from django.conf import settings

    for folder in (ROOT / "platform", ROOT / "node_client"):
        sys.path.insert(0, str(folder))
    settings.configure(SAPO_NATIVE=True)
    django.setup()
    import sapo_native as fast

    from moderation import filters, kernels
    from sapo_node.verifiers.answers import extract_answer

    print(f"sapo_native from {fast.__file__}", flush=True)
    kernels.native = lambda: None  # the twins, unless a round asks for the extension
    done, deadline = 0, time.monotonic() + seconds
    while (rounds is None and time.monotonic() < deadline) or (rounds is not None and done < rounds):
        rng = random.Random(f"{seed}-{done}")
        try:
            text_functions(rng, fast, filters, kernels, extract_answer)
            copy_lookups(rng, fast, filters, kernels)
            arrays(rng, fast)
            hostile(rng, fast)
        except Exception as exc:  # a disagreement, or a twin refusing what C took
            print(f"DISAGREE seed {seed} round {done}: {type(exc).__name__}: {exc}", flush=True)
            return 1
        done += 1
    print(f"{done} rounds agreed (seed {seed}, {seconds:.0f} s), load average {os.getloadavg()[0]:.2f}", flush=True)
    return 0


def sanitized_build(into: Path) -> Path:
    """native/ built with ASan and UBSan into `into`: the folder to put first on sys.path."""
    source = ROOT / "native"
    env = {**os.environ, "CFLAGS": " ".join(SANITIZE), "LDFLAGS": "-fsanitize=address,undefined"}
    subprocess.run(
        [
            sys.executable,
            "setup.py",
            "-q",
            "build_ext",
            "--build-lib",
            str(into / "lib"),
            "--build-temp",
            str(into / "tmp"),
        ],
        cwd=source,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    shutil.copy(source / "sapo_native" / "__init__.py", into / "lib" / "sapo_native" / "__init__.py")
    return into / "lib"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=None, help="this many rounds instead of --seconds")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--installed", action="store_true", help="the installed build, without sanitizers")
    parser.add_argument("--in-build", action="store_true", help=argparse.SUPPRESS)  # the sanitized child
    args = parser.parse_args()
    if args.installed or args.in_build:
        return run(args.seconds, args.seed, args.rounds)
    compiler = sysconfig.get_config_var("CC") or "cc"
    runtime = subprocess.run(
        [compiler.split()[0], "-print-file-name=libasan.so"], capture_output=True, text=True, check=True
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="sapo-native-asan-") as tmp:
        lib = sanitized_build(Path(tmp))
        env = {
            **os.environ,
            "LD_PRELOAD": runtime,
            "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
            "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
            "PYTHONPATH": os.pathsep.join([str(lib), os.environ.get("PYTHONPATH", "")]),
        }
        child = [sys.executable, __file__, "--in-build", "--seconds", str(args.seconds), "--seed", str(args.seed)]
        if args.rounds is not None:
            child += ["--rounds", str(args.rounds)]
        return subprocess.run(child, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
