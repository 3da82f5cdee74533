"""`manage.py sapo_models build|list`: the built-in models a site serves prebuilt to its nodes.

    manage.py sapo_models build                        # tiny and tiny-mini, each built once
    manage.py sapo_models build --models tiny-mini --from-cache ~/.cache/sapo-node
    manage.py sapo_models list                         # what the manifest lists

`build` builds with the nodes' own builder (sapo_node.tiny, seed 0) into SAPO_PREBUILT_DIR, skips a model
already there, and rewrites /models/manifest.json. `--from-cache DIR` copies a finished build of the same
recipe from a node cache instead of building it again (`make run` passes the nodes' cache).
"""

from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from prebuilt import selectors, services

#: What `build` publishes without --models: the models `sapo-node run` and `make run` use on a CPU.
DEFAULT_MODELS = "tiny,tiny-mini"


class Command(BaseCommand):
    help = "Build the built-in models once and publish them to nodes (/models/manifest.json)."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        build = sub.add_parser("build", help="Build the models missing from SAPO_PREBUILT_DIR, then list them all.")
        build.add_argument("--models", default=DEFAULT_MODELS, help="Comma-separated built-in models.")
        build.add_argument(
            "--from-cache",
            type=Path,
            default=None,
            help="A node cache to copy finished builds of the same recipe from.",
        )
        build.add_argument(
            "--threads",
            type=int,
            default=1,
            help="torch threads of a build (default 1: more spin-wait against other work on a machine in use, "
            'docs/node.md "Defaults")',
        )
        build.add_argument("--quiet", action="store_true", help="No progress lines while building.")
        sub.add_parser("list", help="Print what the manifest lists.")

    def handle(self, *args, action: str, **options):
        if action == "build":
            names = [m.strip() for m in options["models"].split(",") if m.strip()]
            from sapo_node.tiny.variants import VARIANTS

            threads = options["threads"]
            if threads < 1:
                raise CommandError(f"--threads must be at least 1, not {threads}")
            if unknown := [n for n in names if n not in VARIANTS]:
                raise CommandError(
                    f"not a built-in model: {', '.join(unknown)} (choose from {', '.join(sorted(VARIANTS))})"
                )
            import torch

            torch.set_num_threads(threads)
            manifest = services.models_publish(
                names=names, from_cache=options["from_cache"], progress=not options["quiet"]
            )
        else:
            manifest = selectors.manifest_get()
            if manifest is None:
                raise CommandError(f"nothing published: no readable {selectors.manifest_path()}")
        for model in manifest.models:
            size = sum(f.size for f in model.files)
            self.stdout.write(f"{model.name}: {model.folder}, {len(model.files)} files, {size / 1e6:.1f} MB")
        if action == "build":
            self.stdout.write(f"published: {selectors.manifest_path()}")
