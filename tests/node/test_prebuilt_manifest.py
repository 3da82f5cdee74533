"""sapo_node.prebuilt's reading of a site's manifest: untrusted bytes, checked before any download."""

from __future__ import annotations

import json

import pytest

from sapo_node.prebuilt import MAX_MANIFEST_BYTES, PrebuiltUnavailable, parse_manifest

SHA = "ab" * 32


def _manifest(**model_changes) -> dict:
    model = {
        "name": "tiny-mini",
        "recipe": SHA,
        "folder": "tiny-mini-abababababab",
        "files": [{"name": "model.safetensors", "size": 10, "sha256": SHA}],
    }
    return {"format": 1, "models": [{**model, **model_changes}]}


def test_a_well_formed_manifest_reads():
    manifest = parse_manifest(json.dumps(_manifest()).encode())
    assert [(m.name, m.folder, m.files[0].size) for m in manifest.models] == [
        ("tiny-mini", "tiny-mini-abababababab", 10)
    ]


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"not json", "not one this client reads"),
        (json.dumps({**_manifest(), "format": 2}).encode(), "format 2"),
        (json.dumps(_manifest(folder="../etc")).encode(), "malformed"),
        (json.dumps(_manifest(folder=".hidden")).encode(), "malformed"),
        (json.dumps(_manifest(recipe="xyz")).encode(), "malformed"),
        (json.dumps(_manifest(files=[{"name": "../../.bashrc", "size": 1, "sha256": SHA}])).encode(), "names files"),
        (json.dumps(_manifest(files=[{"name": "a/b", "size": 1, "sha256": SHA}])).encode(), "names files"),
        (json.dumps(_manifest(files=[{"name": "x", "size": 1, "sha256": SHA}] * 2)).encode(), "names files"),
        (json.dumps(_manifest(files=[{"name": "x", "size": -1, "sha256": SHA}])).encode(), "bad size"),
        (json.dumps(_manifest(files=[{"name": "x", "size": 1, "sha256": "AB" * 32}])).encode(), "bad size"),
        (json.dumps(_manifest(files=[{"name": "x", "size": 3 << 30, "sha256": SHA}])).encode(), "is over"),
        (
            json.dumps(_manifest(files=[{"name": f"f{i}", "size": 1, "sha256": SHA} for i in range(17)])).encode(),
            "malformed",
        ),
        (json.dumps(_manifest(files=[{"name": "x", "size": 1, "sha256": SHA, "url": "http://x"}])).encode(), "reads"),
        (b" " * (MAX_MANIFEST_BYTES + 1), "is over"),
    ],
)
def test_a_hostile_or_foreign_manifest_is_refused_with_its_reason(data, why):
    with pytest.raises(PrebuiltUnavailable, match=why):
        parse_manifest(data)
