"""`sapo-node export`: the policy a node trained, as a Hugging Face model folder with a model card.

    sapo-node export --run runs/laptop --out exported/laptop
    sapo-node export --run runs/laptop --out exported/laptop --push-to-hub alice/sapo-tiny-mini

The folder holds model.safetensors, config.json, generation_config.json, the tokenizer's files and
README.md, the model card: the base model, the rounds trained, the run's configuration (I, J, the
external baseline), the swarm it trained in, and a held-out evaluation this command computes: N
questions per task of the run's catalogue, from a dataset seed no node trains on, scored by the
same verifiers as training, greedy and sampled, for the base model and for the trained one.
`AutoModelForCausalLM.from_pretrained(FOLDER)` loads it. The run folder is only read.

Importing this module stays cheap (the CLI imports it to list the command): torch, transformers and
huggingface_hub load when an export runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from sapo_node import __version__
from sapo_node.config import NodeConfig

if TYPE_CHECKING:  # reasoning-gym loads with sapo_node.tasks: not for `sapo-node --help`
    from sapo_node.tasks import Catalogue

HELP = "write a run's latest checkpoint as a Hugging Face model folder with a model card and a held-out evaluation"

#: Sampled evaluation uses the temperature the nodes sample at (sapo_node.config's default).
SAMPLED_TEMPERATURE = 1.0


class ExportError(Exception):
    """A problem the person running the command can fix; the message says how."""


@dataclass(frozen=True)
class TrainedRun:
    """What an export reads from a run folder."""

    config: NodeConfig
    checkpoint: Path
    rounds: int
    catalogue: Catalogue


@dataclass(frozen=True)
class Evaluation:
    """Mean verified score per dataset, before (the base model) and after (the checkpoint)."""

    n: int
    max_new_tokens: int
    #: {"greedy" | "sampled": {"before" | "after": {dataset: score}}}
    scores: dict[str, dict[str, dict[str, float]]]


def read_run(run: Path) -> TrainedRun:
    """The run's saved config and its latest checkpoint (round, catalogue)."""
    from sapo_node.checkpoint import CheckpointError, latest_checkpoint, read_state

    run = Path(run)
    config_path = run / "config.json"
    if not config_path.is_file():
        raise ExportError(f"{run} is not a run folder: it has no config.json (give the --out of a `sapo-node run`)")
    config = NodeConfig.from_json(json.loads(config_path.read_text()))
    checkpoint = latest_checkpoint(run)
    if checkpoint is None:
        raise ExportError(
            f"{run} has no checkpoint yet: a run writes one every --checkpoint-every rounds and at Ctrl-C"
        )
    try:
        saved = read_state(checkpoint)
    except CheckpointError as exc:
        raise ExportError(str(exc)) from exc
    return TrainedRun(config, checkpoint, saved.round, saved.catalogue)


def evaluate_both_ways(model: Any, tokenizer: Any, catalogue: Catalogue, *, n: int, max_new_tokens: int) -> dict:
    """{"greedy": {dataset: score}, "sampled": {dataset: score}} on questions 0..n-1 of EVAL_SEED."""
    from sapo_node.tiny.evaluation import evaluate

    settings = {"catalogue": catalogue, "n": n, "max_new_tokens": max_new_tokens}
    return {
        "greedy": evaluate(model, tokenizer, temperature=0.0, **settings),
        "sampled": evaluate(model, tokenizer, temperature=SAMPLED_TEMPERATURE, **settings),
    }


def export_run(
    run: Path,
    out: Path,
    *,
    n: int = 32,
    max_new_tokens: int | None = None,
    device: str = "cpu",
    overwrite: bool = False,
) -> tuple[TrainedRun, Evaluation]:
    """Evaluate the base model, load the checkpoint into it, evaluate again, write the folder.

    The folder is written beside `out` and renamed into place, so a failure leaves no half export."""
    from sapo_node.checkpoint import CheckpointError, load_tensors
    from sapo_node.models import load_policy
    from sapo_node.tiny.cache import quiet_transformers

    out = Path(out)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ExportError(f"{out} exists and is not empty: choose another --out, or --overwrite")
    trained = read_run(run)
    config = trained.config.resolved()
    max_new_tokens = max_new_tokens or config.max_new_tokens
    # The checkpoint's tensors keep the dtype the node trained in; the export keeps it too.
    try:
        state_dict = load_tensors(trained.checkpoint / "model.pt")
    except CheckpointError as exc:
        raise ExportError(str(exc)) from exc
    dtype = next(t.dtype for t in state_dict.values() if t.is_floating_point())
    try:  # the architecture and tokenizer come from the base model, as the run loaded it
        model, tokenizer, _ = load_policy(config.model, device=device, dtype=dtype)
    except OSError as exc:  # a hub id not cached while offline, a local folder moved
        raise ExportError(f"cannot load the run's base model {config.model!r}: {exc}") from exc

    before = evaluate_both_ways(model, tokenizer, trained.catalogue, n=n, max_new_tokens=max_new_tokens)
    model.load_state_dict(state_dict)
    model.eval()
    after = evaluate_both_ways(model, tokenizer, trained.catalogue, n=n, max_new_tokens=max_new_tokens)
    scores = {mode: {"before": before[mode], "after": after[mode]} for mode in ("greedy", "sampled")}
    evaluation = Evaluation(n, max_new_tokens, scores)

    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
    try:
        with quiet_transformers():
            model.to("cpu").save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        (staging / "README.md").write_text(model_card(trained, evaluation))
        if out.exists():
            shutil.rmtree(out)
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return trained, evaluation


#: What the hub accepts as a model id: an optional owner and a name, letters, digits, "-", "_", ".".
HUB_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]{0,95}/)?[A-Za-z0-9][\w.-]{0,95}$")


def model_names(model: str) -> tuple[str | None, str]:
    """(hub id or None, the name the card gives the base model). A local folder is named by its last
    component only: its full path (a home folder, a user name) stays on this machine."""
    from sapo_node.tiny.variants import VARIANTS

    if model in VARIANTS:
        return None, model
    path = Path(model).expanduser()
    if path.exists() or not HUB_ID.match(model) or ".." in model:
        return None, re.split(r"[\\/]", str(path.resolve()))[-1] or "a local folder"
    return model, model


def base_model_line(model: str) -> tuple[str | None, str]:
    """(hub id for the card's metadata or None, how the card's table names the base model)."""
    from sapo_node.packaged import PACKAGED
    from sapo_node.tiny.variants import VARIANTS

    hub_id, name = model_names(model)
    if model in VARIANTS:
        return None, f"`{name}`, a model built in to sapo-node (made locally by `sapo_node.tiny`, no download)"
    if model in PACKAGED:
        spec = PACKAGED[model]
        return spec.hub_id, (
            f"[{spec.hub_id}](https://huggingface.co/{spec.hub_id}), read from the {spec.gguf_file} file that"
            f" the `{spec.distribution}` {spec.version} package ships (dequantised to float32)"
        )
    if hub_id is None:
        return None, f"a local model folder (`{name}`)"
    return hub_id, f"[{hub_id}](https://huggingface.co/{hub_id})"


def swarm_line(config: NodeConfig) -> str:
    if config.offline or not config.server:
        return "none: the node trained alone (silo), on its own rollouts only"
    parts = urlsplit(config.server)  # a user name, password or query in the URL stays on this machine
    host = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
    return f"the swarm at `{parts._replace(netloc=host, query='', fragment='').geturl()}`"


def model_card(trained: TrainedRun, evaluation: Evaluation) -> str:
    from sapo_node.tiny.evaluation import EVAL_SEED

    config = trained.config
    hub_id, base = base_model_line(config.model)
    front = [
        "---",
        "library_name: transformers",
        "pipeline_tag: text-generation",
        "tags: [sapo, grpo, reinforcement-learning, reasoning-gym]",
    ]
    if hub_id:
        front.append(f"base_model: {hub_id}")
    front.append("---")
    arm = "silo (J = 0)" if config.offline or config.external == 0 else "sharing with the swarm"
    lines = [
        *front,
        "",
        f"# {model_names(config.model)[1]} trained with SAPO",
        "",
        f"Post-trained with GRPO on verifiable reasoning-gym tasks by a SAPO node (sapo-node {__version__}): "
        "each round it trains on I groups of its own rollouts and J groups shared by other nodes of its swarm.",
        "",
        "| | |",
        "|---|---|",
        f"| base model | {base} |",
        f"| rounds trained | {trained.rounds} |",
        f"| swarm | {swarm_line(config)} |",
        f"| arm | {arm} |",
        f"| B questions per round, G completions per question | {config.questions}, {config.generations} |",
        f"| I own groups, J external groups per round | {config.local}, {config.external} ({config.ratio}) |",
        f"| external groups' baseline | {config.external_baseline} |",
        f"| learning rate, seed | {config.lr:g}, {config.seed} |",
        f"| task catalogue | {trained.catalogue.name}: {', '.join(trained.catalogue.datasets)} |",
        "",
        "## Held-out evaluation",
        "",
        f"{evaluation.n} questions per task (reasoning-gym dataset seed {EVAL_SEED}, which the nodes do not train "
        f"on), at most {evaluation.max_new_tokens} new tokens, scored by the task's verifier (1 is a correct answer "
        f"in `<answer>` tags). Greedy decoding, and sampling at temperature {SAMPLED_TEMPERATURE:g}. Before is the "
        "base model, after is this one. Computed by `sapo-node export`.",
        "",
        "| task | greedy before | greedy after | sampled before | sampled after |",
        "|---|---|---|---|---|",
    ]
    greedy, sampled = evaluation.scores["greedy"], evaluation.scores["sampled"]
    datasets = list(greedy["before"])
    for name in [*datasets, "mean"]:
        cells = []
        for mode in (greedy, sampled):
            for side in ("before", "after"):
                values = mode[side]
                value = sum(values.values()) / len(values) if name == "mean" else values[name]
                cells.append(f"{value:.3f}")
        label = "**mean**" if name == "mean" else name
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Use",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        'model = AutoModelForCausalLM.from_pretrained("PATH_OR_REPO")',
        'tokenizer = AutoTokenizer.from_pretrained("PATH_OR_REPO")',
        "```",
        "",
    ]
    return "\n".join(lines)


def push_to_hub(folder: Path, repo: str) -> str:
    """Upload `folder` to the model repository `repo` (created if missing); returns its URL."""
    from huggingface_hub import HfApi, constants, get_token

    if constants.HF_HUB_OFFLINE:
        raise ExportError("the Hugging Face hub is switched off (HF_HUB_OFFLINE is set)")
    if not get_token():
        raise ExportError("no Hugging Face token: run `hf auth login` or set HF_TOKEN")
    api = HfApi()
    try:
        api.create_repo(repo, repo_type="model", exist_ok=True)
        api.upload_folder(
            folder_path=str(folder), repo_id=repo, repo_type="model", commit_message=f"sapo-node {__version__} export"
        )
    # Any failure of the upload is reported, never a traceback: the hub's HTTP client differs by version
    # (requests, httpx, httpx2) and raises its own types, none of them OSErrors.
    except Exception as exc:
        raise ExportError(f"could not push to {repo}: {type(exc).__name__}: {exc}") from exc
    return f"{constants.ENDPOINT}/{repo}"


# ---------------------------------------------------------------------------- sapo-node export


def add_command(subparsers: Any) -> None:
    parser = subparsers.add_parser("export", help=HELP, description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--run", required=True, type=Path, metavar="DIR", help="the run folder (a `sapo-node run --out`)"
    )
    parser.add_argument("--out", required=True, type=Path, metavar="FOLDER", help="where to write the model folder")
    parser.add_argument("-n", type=int, default=32, help="held-out questions per task for the card (default: 32)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default: the run's")
    parser.add_argument("--device", default="cpu", help="where to evaluate: cpu, cuda, mps, auto (default: cpu)")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    parser.add_argument("--push-to-hub", metavar="REPO", help="then upload the folder to this Hugging Face model repo")
    parser.set_defaults(handler=export_command)


def export_command(args: argparse.Namespace) -> int:
    if args.n < 1:
        print("sapo-node export: error: -n must be at least 1", file=sys.stderr)
        return 2
    try:
        trained, evaluation = export_run(
            args.run,
            args.out,
            n=args.n,
            max_new_tokens=args.max_new_tokens,
            device=args.device,
            overwrite=args.overwrite,
        )
    except ExportError as exc:
        print(f"sapo-node export: error: {exc}", file=sys.stderr)
        return 2
    greedy = evaluation.scores["greedy"]
    mean = {side: sum(v.values()) / len(v) for side, v in greedy.items()}
    print(f"exported round {trained.rounds} of {args.run} to {args.out}")
    print(f"held-out greedy score (n={evaluation.n} per task): {mean['before']:.3f} before, {mean['after']:.3f} after")
    if args.push_to_hub:
        try:
            url = push_to_hub(args.out, args.push_to_hub)
        except ExportError as exc:
            print(f"sapo-node export: error: {exc}. The folder {args.out} is kept; push it later.", file=sys.stderr)
            return 1
        print(f"pushed to {url}")
    return 0
