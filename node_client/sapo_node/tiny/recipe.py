"""A build's recipe: everything the built model depends on, and its digest, which names the cache
folder and must match a prebuilt model's."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from sapo_node.prompts import format_plain, format_target
from sapo_node.tasks import CATALOGUES
from sapo_node.tiny.batches import format_bare
from sapo_node.tiny.variants import TinyVariant, get_variant

#: Bump when the build changes in a way the variant fields do not capture: old caches are then ignored.
RECIPE_VERSION = 1

#: Recipe fields added after the first builds: left out of the hash at their defaults, so the
#: caches of tiny and tiny-mini built before them stay valid.
_LATER_FIELDS = {"known": (), "format_steps": 0, "format_lr": 0.0, "bare_share": 0.0, "catalogue": "easy"}


def recipe(variant: TinyVariant, seed: int, steps: int) -> dict[str, Any]:
    """Everything the built model depends on; its hash names the cache folder."""
    fields = dataclasses.asdict(dataclasses.replace(variant, steps=steps))
    for name, default in _LATER_FIELDS.items():
        if fields[name] == default or fields[name] == list(default or ()):
            del fields[name]
    if "known" in fields:
        fields["known"] = list(fields["known"])
    out = {
        "version": RECIPE_VERSION,
        "variant": fields,
        "seed": seed,
        "catalogue": CATALOGUES[variant.catalogue].to_json(),
        "prompt": format_plain("{question}") + format_target("{answer}"),
    }
    if variant.bare_share:
        out["bare"] = format_bare("{answer}")
    return out


def recipe_digest(variant: str = "tiny", seed: int = 0, steps: int | None = None) -> str:
    """sha256 (hex) of the recipe: a prebuilt model is taken only when its digest is this one."""
    spec = get_variant(variant)
    text = json.dumps(recipe(spec, seed, spec.steps if steps is None else steps), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()
