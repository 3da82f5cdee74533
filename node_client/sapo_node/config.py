"""The one configuration of a node run. Every field is documented where it is declared; the CLI
takes its help text from these docstrings, and the resolved config is printed at start and saved as
config.json beside metrics.jsonl, so every run can be repeated."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import random
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from sapo_node.machine import Machine, describe_fit, fit_round

#: Built-in tiny models (sapo_node.tiny): they get the easy catalogue and tiny-model defaults
#: ("small", the built-in model for a GPU, gets the sapo catalogue and its own defaults).
TINY_MODELS = ("tiny", "tiny-mini", "tiny-learn", "tiny-learn-a", "tiny-learn-b")

#: Fields never written to disk or printed in clear.
SECRET_FIELDS = ("token",)


@dataclass
class NodeConfig:
    # --- where the node runs ---
    server: str | None = None
    """WebSocket URL of the platform's node endpoint, e.g. wss://sapo.example.org/ws/node/ (also SAPO_SERVER)."""
    token: str | None = None
    """The node's token, sent as `Authorization: Bearer`; also read from SAPO_TOKEN. Never saved."""
    swarm: str | None = None
    """The site's swarm to join, by its slug (the site lists them at /swarms/), or `any` to let the server
    choose the open swarm that needs nodes most; none: the site's default swarm (also SAPO_SWARM)."""
    offline: bool = False
    """Train in silo: no server, no sharing, no external groups (J is then 0 in effect)."""
    model: str = "tiny"
    """Policy: built in and made locally (tiny, tiny-mini, tiny-learn, tiny-learn-a, tiny-learn-b; small for a
    GPU), shipped by a package (smollm2-135m: SmolLM2-135M-Instruct, from `sapo-node[smollm2]`), or a Hugging
    Face id or local path."""
    device: str = "auto"
    """auto (cuda, then mps, then cpu), cpu, cuda, cuda:N or mps."""
    dtype: str = "auto"
    """Weights dtype: auto (bfloat16 on CUDA, float32 elsewhere), float32, bfloat16 or float16."""
    threads: int | None = None
    """torch CPU threads; none: OMP_NUM_THREADS if set, else the cores other processes leave idle (at least 1);
    0 keeps torch's default, all cores, which spin-wait against other work on a machine in use."""
    out: str = "sapo-run"
    """Run directory: config.json, metrics.jsonl, checkpoints/ and the outbox of unacknowledged shares."""
    resume: bool = False
    """Continue from the latest checkpoint in --out (the saved config.json is the base; flags given override).
    Online, the server is the one --server or SAPO_SERVER names: a folder naming another is refused."""
    seed: int | None = None
    """Seed of the question stream, sampling and initialisation; None draws one (saved in config.json)."""
    pause_when_busy: float | None = None
    """Pause while the 1-minute load average of the machine's other work (the node's own CPU use left out)
    exceeds this; resume once it falls below 3/4 of it (sapo_node.idle); none: never. Not kept by --resume."""
    pause_on_battery: bool = False
    """Pause while the machine runs on battery (Linux: /sys/class/power_supply; macOS: pmset; elsewhere
    not supported: the node says so and works on). Not kept by --resume."""
    no_heldout_check: bool = False
    """Do not answer the server's held-out checks (a few questions answered greedily between rounds, which
    the site's held-out accuracy is made of; docs/node.md): for a machine where a few extra answers a
    minute are too slow. The server then never asks this node."""

    # --- the round (SAPO Algorithm 1) ---
    rounds: int = 0
    """Number of the last round to run (a resumed run continues to it); 0 runs until Ctrl-C."""
    questions: int | None = None
    """B: questions sampled from the node's own stream per round; none: chosen from the model and the machine
    (sapo_node.machine; 8 for tiny models)."""
    generations: int | None = None
    """G: completions generated per question (the group); none: chosen from the model and the machine."""
    local: int = 4
    """I: own groups in the training set of a round."""
    external: int = 4
    """J: groups from the swarm's pool in the training set of a round (0 = silo)."""
    ratio: str = "fixed"
    """fixed: I own and J external groups every round. adaptive: I + J groups, J in [0, J] picked each round
    from the node's own measurements (informative own groups, re-scored reward of received groups; sapo_node.ratio)."""
    external_baseline: str = "group"
    """group: an external group's advantages are within the group (GRPO's, the paper's). own: its completions are
    judged against this node's own moving-average reward on that task, so a peer's success at a task this node
    fails at is learned whole (sapo_node.baseline)."""
    correction: str = "off"
    """Importance correction of external completions that carry their sharer's per-token log-probabilities
    (a group made under a server challenge): off (trained as if this node had sampled them, the paper's),
    token (each token's loss weighted by min(p_node / p_sharer, C), truncated importance sampling), or
    sequence (the completion's tokens weighted by min(prod p_node / p_sharer, C)); docs/node.md."""
    correction_cap: float = 2.0
    """C: the truncation of the importance weights of --correction."""
    correction_mismatch: str = "uncorrected"
    """An external group whose log-probabilities do not apply to this node's tokens (none sent, another
    model or tokenizer, greedy, tokens that differ once its text is tokenised here), when --correction or
    --offpolicy-filter is on: uncorrected (trained with weight 1) or skip (left out)."""
    offpolicy_filter: float | None = None
    """F-TIS: an external completion of negative advantage whose mean per-token log(p_sharer / p_node) (the k1
    estimate of KL(sharer || node)) exceeds this many nats gets weight 0; none: off."""
    success_gate: bool = False
    """Keep only external groups with at least one completion this node verifies correct (reward 1)."""
    learning_zone_low: float = 0.0
    """External groups whose reward mean lies in [learning-zone-low, learning-zone-high] are chosen first,
    the others only to fill J; the default band [0, 1] holds every group (no preference)."""
    learning_zone_high: float = 1.0
    """The upper end of the learning zone (see --learning-zone-low)."""
    catalogue: str | None = None
    """Offline catalogue: easy or sapo; None picks easy for tiny models, sapo otherwise. Online the server's is used."""
    max_new_tokens: int | None = None
    """Tokens generated per completion at most; none: chosen from the model and the machine (48 for tiny models)."""
    temperature: float = 1.0
    """Sampling temperature of generation (the loss uses the same temperature)."""
    generate_batch: int = 0
    """Sequences per generate call; 0 puts all B*G completions in one call."""

    # --- the GRPO update ---
    lr: float | None = None
    """AdamW learning rate; None: 1e-4 for tiny models, 1e-5 otherwise (the SAPO demo's)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    kl_coef: float = 0.0
    """Weight of the k3 KL penalty to the initial policy; 0 (the paper's) keeps no reference model."""
    eps_low: float = 0.2
    """Lower clip range of the importance ratio: ratios below 1 - eps_low stop pushing down."""
    eps_high: float = 0.28
    """Upper clip range (DAPO's clip-higher): ratios above 1 + eps_high stop pushing up."""
    epochs: int = 1
    """Optimisation steps per round over the whole training set (old log-probs stay those before the update)."""
    micro_batch: int | None = None
    """Sequences per forward/backward pass; gradients accumulate, so this bounds memory, not the maths; none:
    the largest of 16, 8, 4, 2, 1 whose round fits the machine's free memory."""
    max_grad_norm: float = 1.0
    """Gradient clipping by global norm."""

    # --- durability and networking ---
    checkpoint_every: int = 10
    """Save a checkpoint every N rounds (and always on Ctrl-C and at the end); 0 only at those times."""
    keep_checkpoints: int = 2
    """How many checkpoints to keep in --out/checkpoints."""
    connect_wait: float = 15.0
    """Seconds to wait at start-up for the server's catalogue before falling back to the default one."""
    flush_wait: float = 10.0
    """Seconds to wait at exit for the server to acknowledge pending shares (the rest stay in the outbox)."""

    # ------------------------------------------------------------------ helpers
    @property
    def is_tiny(self) -> bool:
        return self.model in TINY_MODELS

    def resolved(self) -> NodeConfig:
        """A copy with every automatic default (None) replaced by the value this run uses."""
        c = dataclasses.replace(self)
        if c.seed is None:
            c.seed = random.SystemRandom().randrange(2**31 - 1)
        if c.catalogue is None:
            c.catalogue = "easy" if c.is_tiny else "sapo"
        # A run from the command line has these from the machine (sapo_node.machine.fit_round); a
        # config built in code keeps the figures the experiments were measured with.
        if c.threads is None:
            c.threads = 0
        if c.questions is None:
            c.questions = 8
        if c.generations is None:
            c.generations = 8
        if c.micro_batch is None:
            c.micro_batch = 16
        if c.max_new_tokens is None:
            c.max_new_tokens = 48 if c.is_tiny else 256
        if c.lr is None:
            c.lr = 1e-4 if c.is_tiny else 1e-5
        if c.offline:
            c.external = 0
        c.validate()
        return c

    def fit_to(self, machine: Machine) -> tuple[NodeConfig, str]:
        """A copy with the settings left unset chosen for `machine` (sapo_node.machine.fit_round), and
        the one line that says every choice. Raises MachineTooSmall (a ValueError) when the model
        cannot fit the machine's free memory."""
        fitted = fit_round(
            self.model,
            machine,
            threads=self.threads,
            questions=self.questions,
            generations=self.generations,
            max_new_tokens=self.max_new_tokens,
            micro_batch=self.micro_batch,
            tiny=self.is_tiny,
        )
        config = dataclasses.replace(
            self,
            threads=fitted.threads,
            questions=fitted.questions,
            generations=fitted.generations,
            max_new_tokens=fitted.max_new_tokens,
            micro_batch=fitted.micro_batch,
        )
        return config, describe_fit(self.model, machine, fitted)

    def validate(self) -> None:
        checks = {
            "questions must be >= 1": self.questions >= 1,
            "generations must be >= 2 (advantages compare completions of a group)": self.generations >= 2,
            "local and external must be >= 0": self.local >= 0 and self.external >= 0,
            "local + external must be >= 1": self.local + self.external >= 1,
            "rounds must be >= 0": self.rounds >= 0,
            "threads must be >= 0": self.threads >= 0,
            "pause_when_busy must be > 0": self.pause_when_busy is None or self.pause_when_busy > 0,
            "ratio must be fixed or adaptive": self.ratio in ("fixed", "adaptive"),
            "external_baseline must be group or own": self.external_baseline in ("group", "own"),
            "correction must be off, token or sequence": self.correction in ("off", "token", "sequence"),
            "correction_cap must be >= 1": self.correction_cap >= 1,
            "correction_mismatch must be uncorrected or skip": self.correction_mismatch in ("uncorrected", "skip"),
            "offpolicy_filter must be >= 0": self.offpolicy_filter is None or self.offpolicy_filter >= 0,
            "learning_zone_low <= learning_zone_high": self.learning_zone_low <= self.learning_zone_high,
            "epochs must be >= 1": self.epochs >= 1,
            "micro_batch must be >= 1": self.micro_batch >= 1,
            "temperature must be > 0": self.temperature > 0,
            "eps_low must be in [0, 1)": 0 <= self.eps_low < 1,
            "eps_high must be >= 0": self.eps_high >= 0,
            "catalogue must be easy or sapo": self.catalogue in (None, "easy", "sapo"),
            "dtype must be auto, float32, bfloat16 or float16": self.dtype
            in ("auto", "float32", "bfloat16", "float16"),
        }
        errors = [message for message, ok in checks.items() if not ok]
        if errors:
            raise ValueError("; ".join(errors))

    def to_json(self) -> dict[str, Any]:
        """The config as saved: secrets left out."""
        data = dataclasses.asdict(self)
        for name in SECRET_FIELDS:
            data[name] = "<set>" if data[name] else None
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NodeConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names and k not in SECRET_FIELDS}
        return cls(**values)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n")


@lru_cache(maxsize=1)
def field_docs() -> dict[str, str]:
    """{field name: its docstring}, read from the source of NodeConfig (used as CLI help)."""
    tree = ast.parse(inspect.getsource(NodeConfig))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for stmt, following in zip(body, body[1:], strict=False):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[stmt.target.id] = following.value.value
    return docs
