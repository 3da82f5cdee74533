"""A checkpoint as its difference from a base (sapo_node.weightdiff): the reconstruction is bit for bit
the checkpoint in every dtype a node trains or keeps buffers in, including weights whose sign or
exponent changed; what is not a valid difference of that base is refused with its code."""

from __future__ import annotations

import io

import pytest
import torch

from sapo_node import weightdiff
from sapo_node.commitments import tensors_digest


@pytest.fixture
def base() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {
        "w": torch.randn(64, 33, generator=g),
        "b": torch.randn(7, generator=g),
        "mask": torch.zeros(5, dtype=torch.bool),
        "ids": torch.arange(6),
        "empty": torch.zeros(0, 3),
    }


def updated(base: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    w = base["w"] + torch.randn(base["w"].shape, generator=g) * 1e-5
    w[0, :4] = torch.tensor([-base["w"][0, 0], 0.0, float("inf"), 1e30])  # sign, zero, inf, exponent changed
    return {
        "w": w.to(dtype),
        "b": base["b"].to(dtype),  # unchanged but for the cast
        "mask": torch.tensor([True, False, True, True, False]),
        "ids": torch.arange(6) * 3 - 5,
        "empty": torch.zeros(0, 3, dtype=dtype),
    }


def write(tmp_path, tensors, base, **overrides):
    path = tmp_path / "c.sapodiff"
    fields = {"model": "tiny-mini", "base_digest": tensors_digest(base), "weights": tensors_digest(tensors)}
    weightdiff.write_diff(path, tensors, base, **{**fields, **overrides})
    return path


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_reconstruction_is_the_checkpoint_bit_for_bit(tmp_path, base, dtype):
    tensors = updated(base, dtype)
    path = write(tmp_path, tensors, base)
    back = weightdiff.read_diff(path, base, base_digest=tensors_digest(base), max_bytes=1 << 20)
    assert tensors_digest(back) == tensors_digest(tensors)
    assert {k: v.dtype for k, v in back.items()} == {k: v.dtype for k, v in tensors.items()}
    with path.open("rb") as f:
        header = weightdiff.read_header(f, file_size=path.stat().st_size)
    assert header.weights == tensors_digest(tensors) and header.raw_bytes == sum(
        t.numel() * t.element_size() for t in tensors.values()
    )


def test_a_small_update_compresses_and_the_unchanged_base_to_almost_nothing(tmp_path, base):
    small = {k: v.clone() for k, v in base.items()}
    small["w"] = base["w"] + torch.randn(base["w"].shape) * 1e-5
    raw = sum(t.numel() * t.element_size() for t in small.values())
    assert write(tmp_path, small, base).stat().st_size < 0.75 * raw
    assert write(tmp_path, dict(base), base).stat().st_size < 1200  # the header and empty planes


def test_what_is_not_a_difference_of_this_base_is_refused_with_its_code(tmp_path, base):
    tensors = updated(base, torch.float32)
    digest = tensors_digest(base)
    path = write(tmp_path, tensors, base)
    data = path.read_bytes()

    def refused(raw: bytes, **kw) -> str:
        path.write_bytes(raw)
        with pytest.raises(weightdiff.DiffError) as err:
            weightdiff.read_diff(
                path, kw.get("of", base), base_digest=kw.get("digest", digest), max_bytes=kw.get("max_bytes", 1 << 20)
            )
        return err.value.code

    assert refused(data, digest="0" * 64) == "unknown_base"
    assert refused(data, max_bytes=100) == "checkpoint_too_large"
    assert refused(data[:-1]) == "bad_diff"  # the streams do not fill the file
    assert refused(b"PK\x03\x04" + data[4:]) == "bad_diff"  # no magic
    assert refused(data, of={k: v for k, v in base.items() if k != "b"}) == "bad_diff"  # another model's tensors
    with pytest.raises(weightdiff.DiffError):
        weightdiff.read_header(io.BytesIO(weightdiff.MAGIC + (2**30).to_bytes(4, "little")), file_size=1 << 31)
