"""What the machine has (cores, load, free memory, an accelerator), what a model needs, and the round
a node runs on it by default.

The facts are read without importing torch wherever the platform allows: the command line sizes
the run, and refuses one that cannot fit, before the minute of imports and the model's load. Only a
machine that shows an NVIDIA driver (or Apple Silicon) has torch imported to confirm its device.

`fit_round(config, machine)` fills what the user left unset (threads; B, G, new tokens and
micro-batch of a round) from a `Machine` value, so tests hand it the facts of any machine.
The figures behind the estimates are measured by bench/round_size.py and bench/threads.py
(docs/node.md, "Defaults").
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path

GIB = 2**30


@dataclass(frozen=True)
class Machine:
    cores: int
    """CPUs this process may run on."""
    load: float
    """1-minute load average: runnable processes, this node not yet among them."""
    free_memory: int
    """Bytes the system can give without swapping (Linux: MemAvailable, bounded by a cgroup limit)."""
    device: str = "cpu"
    """Where the model runs: cpu, cuda, cuda:N or mps."""
    device_memory: int | None = None
    """Free bytes on a CUDA device; None for cpu and mps (mps shares free_memory)."""

    @property
    def idle_cores(self) -> float:
        return max(0.0, self.cores - self.load)


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only transformer that set its memory and compute."""

    layers: int
    hidden: int
    kv_dim: int
    """Width of one layer's keys (= its values): key/value heads x head size."""
    intermediate: int
    vocab: int
    tied: bool = True
    """Input and output embeddings are one matrix."""
    prompt_tokens: int = 256
    """A generous prompt length for its catalogue (chat template and question)."""

    @property
    def params(self) -> int:
        h, layer = self.hidden, 0
        layer += h * h + h  # q and its bias
        layer += 2 * (h * self.kv_dim + self.kv_dim)  # k, v and their biases
        layer += h * h + 3 * h * self.intermediate + 2 * h  # o, the MLP, two norms
        return self.layers * layer + self.vocab * h * (1 if self.tied else 2) + h


#: The models a node knows by name, and the paper's (sapo_node.tiny.variants.VARIANTS, sapo_node.packaged;
#: tests/node/test_machine.py checks these against the built models). Other hub ids and folders are
#: read from their config.json when it is on disk.
MODEL_SHAPES: dict[str, ModelShape] = {
    "tiny-mini": ModelShape(layers=4, hidden=128, kv_dim=64, intermediate=384, vocab=1024, prompt_tokens=96),
    "tiny": ModelShape(layers=6, hidden=256, kv_dim=128, intermediate=704, vocab=2048, prompt_tokens=96),
    "small": ModelShape(layers=8, hidden=512, kv_dim=256, intermediate=1408, vocab=4096, prompt_tokens=160),
    "smollm2-135m": ModelShape(layers=30, hidden=576, kv_dim=192, intermediate=1536, vocab=49152, prompt_tokens=192),
    "Qwen/Qwen2.5-0.5B-Instruct": ModelShape(
        layers=24, hidden=896, kv_dim=128, intermediate=4864, vocab=151936, prompt_tokens=192
    ),
}
for _variant in ("tiny-learn", "tiny-learn-a", "tiny-learn-b", "tiny-sparse"):
    MODEL_SHAPES[_variant] = MODEL_SHAPES["tiny-mini"]
#: A model whose config is nowhere on disk (a hub id not downloaded yet) is sized as the paper's.
UNKNOWN_SHAPE = MODEL_SHAPES["Qwen/Qwen2.5-0.5B-Instruct"]


def model_shape(model: str) -> tuple[ModelShape, bool]:
    """(shape, known): the table's, else read from a local folder's or the hub cache's config.json."""
    if model in MODEL_SHAPES:
        return MODEL_SHAPES[model], True
    for path in _config_files(model):
        try:
            data = json.loads(path.read_text())
            hidden = int(data["hidden_size"])
            heads = int(data["num_attention_heads"])
            return ModelShape(
                layers=int(data["num_hidden_layers"]),
                hidden=hidden,
                kv_dim=int(data.get("num_key_value_heads") or heads) * int(data.get("head_dim") or hidden // heads),
                intermediate=int(data.get("intermediate_size") or 4 * hidden),
                vocab=int(data["vocab_size"]),
                tied=bool(data.get("tie_word_embeddings", False)),
            ), True
        except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
            continue
    return UNKNOWN_SHAPE, False


def _config_files(model: str) -> list[Path]:
    files = [Path(model) / "config.json"]
    hub = Path(
        os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", Path.home() / ".cache/huggingface")) / "hub"
    )
    files += sorted((hub / ("models--" + model.replace("/", "--")) / "snapshots").glob("*/config.json"))
    return [f for f in files if f.is_file()]


# ---------------------------------------------------------------------------- memory and time of a round

#: Resident memory of a node besides its model: Python, torch, transformers, reasoning-gym, the tasks
#: (a tiny-mini node peaks at 0.46 GiB in all: bench/round_size.py).
RUNTIME_BYTES = GIB // 2
#: Floats a training forward pass keeps per token and layer, in units of the hidden width (norms'
#: inputs and outputs, q, attention output, residuals) and of the MLP width (gate, up, activation, product).
ACTIVATIONS_PER_HIDDEN = 8
ACTIVATIONS_PER_INTERMEDIATE = 4
#: Vocabulary-wide float32 tensors per completion token of the update (the LM head runs only there):
#: logits, log-softmax, their gradients.
LOGIT_COPIES = 4
#: The share of the free memory a default may plan to use; the rest is the machine's and the estimate's.
HEADROOM = 0.8


def dtype_bytes(device: str) -> int:
    """float32 on cpu and mps, bfloat16 on cuda (sapo_node.models.resolve_dtype's default)."""
    return 2 if device.startswith("cuda") else 4


def peak_bytes(
    shape: ModelShape, questions: int, generations: int, new_tokens: int, micro_batch: int, device: str
) -> int:
    """Estimated peak memory of a round on `device`: the model with its gradients and AdamW's two
    moments, then the larger of generation (a key/value cache for each of the B x G rows) and the
    update (one micro-batch's activations; a group's prompt runs once for its G completions, and
    the vocabulary-wide logits exist only at completion tokens). On cpu and mps it includes the
    runtime; on cuda it is the device's share. bench/round_size.py prints it beside measurements."""
    d = dtype_bytes(device)
    model = shape.params * (2 * d + 8)  # weights, gradients (dtype), AdamW moments (float32)
    rows, tokens = questions * generations, shape.prompt_tokens + new_tokens
    generate = rows * tokens * (2 * shape.layers * shape.kv_dim * d + 4 * shape.hidden) + rows * shape.vocab * 4 * 2
    per_token = shape.layers * (
        ACTIVATIONS_PER_HIDDEN * shape.hidden + ACTIVATIONS_PER_INTERMEDIATE * shape.intermediate
    )
    row_tokens = new_tokens + shape.prompt_tokens / max(1, min(generations, micro_batch))
    update = micro_batch * (row_tokens * per_token * d + new_tokens * LOGIT_COPIES * shape.vocab * 4)
    runtime = 0 if device.startswith("cuda") else RUNTIME_BYTES
    return int(runtime + model + max(generate, update))


#: Parameter-tokens one CPU thread with a core to itself processes per second in a round, generation
#: and update together (smollm2-135m on 2 cores at load 7: 1.8-1.9e10 after the load's share;
#: bench/round_size.py). Idle machines run faster than this says: the defaults err small.
CPU_PARAM_TOKENS_PER_THREAD_SECOND = 1.8e10
#: The round a CPU default aims at; a node that takes minutes a round says nothing for minutes.
CPU_ROUND_SECONDS = 45.0


def round_seconds(
    machine: Machine, shape: ModelShape, questions: int, generations: int, new_tokens: int, threads: int
) -> float:
    """Estimated seconds of a CPU round. Each completion token is one forward step of generation
    and a forward and backward (three forwards) in the update; a group's prompt is run once to
    generate and once to update. The threads get the share of the cores the load leaves them."""
    per_row = 4 * new_tokens + 4 * shape.prompt_tokens / max(1, generations)
    work = shape.params * questions * generations * per_row
    share = max(1, threads) * min(1.0, machine.cores / (machine.load + max(1, threads)))
    return work / (CPU_PARAM_TOKENS_PER_THREAD_SECOND * share)


# ---------------------------------------------------------------------------- the defaults

#: Rounds a default may take, largest first: (B, G, new tokens). G stays >= 4 while it can, since
#: advantages compare the completions of a group.
ROUND_SHAPES = (
    (8, 8, 256),
    (8, 8, 128),
    (8, 8, 64),
    (4, 8, 64),
    (4, 4, 64),
    (4, 4, 32),
    (2, 4, 32),
    (2, 2, 32),
)
#: Built-in tiny models: their own round (the catalogue's answers are short).
TINY_ROUND = (8, 8, 48)
MICRO_BATCHES = (16, 8, 4, 2, 1)


class MachineTooSmall(ValueError):
    """The model does not fit this machine's free memory even at the smallest round."""


@dataclass(frozen=True)
class Fitted:
    threads: int
    questions: int
    generations: int
    max_new_tokens: int
    micro_batch: int
    peak: int
    """Estimated peak bytes of a round at these settings."""
    budget: int
    """Bytes the round may use: the free memory (of the device on cuda) less the headroom."""
    seconds: float | None
    """Estimated seconds of a round on cpu; None elsewhere."""
    known: bool = True
    """The model's size was known (else it was sized as UNKNOWN_SHAPE)."""


def choose_threads(machine: Machine, environ: dict[str, str] | None = None) -> int:
    """Threads for torch: OMP_NUM_THREADS when the user set it, else the cores no other process is
    using (at least 1). All cores on a machine in use spin-wait against the other work: on 2 cores
    at load 3, tiny-mini rounds took 12-15x longer on 2 threads than on 1 (docs/node.md)."""
    environ = os.environ if environ is None else environ
    given = environ.get("OMP_NUM_THREADS", "").strip()
    if given.isdigit() and int(given) > 0:
        return int(given)
    return max(1, min(machine.cores, math.floor(machine.idle_cores + 0.25)))


def fit_round(
    model: str,
    machine: Machine,
    *,
    threads: int | None = None,
    questions: int | None = None,
    generations: int | None = None,
    max_new_tokens: int | None = None,
    micro_batch: int | None = None,
    tiny: bool = False,
) -> Fitted:
    """The round this machine runs by default: values given are kept, the rest chosen so that the
    estimated peak fits the budget and (on cpu) the round takes about CPU_ROUND_SECONDS at most.
    Raises MachineTooSmall when even the smallest round does not fit."""
    shape, known = model_shape(model)
    device = machine.device
    threads = choose_threads(machine) if threads is None else threads
    working = threads or machine.cores  # 0: torch's default, every core
    free = machine.device_memory if device.startswith("cuda") and machine.device_memory else machine.free_memory
    budget = int(free * HEADROOM)

    def keep(value: int | None, default: int) -> int:
        return value if value is not None else default

    def fits(b: int, g: int, t: int, m: int) -> bool:
        return peak_bytes(shape, b, g, t, m, device) <= budget

    if not fits(*ROUND_SHAPES[-1], 1):
        raise MachineTooSmall(too_small_message(model, machine, budget))
    candidates = [TINY_ROUND] if tiny else list(ROUND_SHAPES)
    chosen = None
    for b, g, t in candidates:
        b, g, t = keep(questions, b), keep(generations, g), keep(max_new_tokens, t)
        if not fits(b, g, t, 1):
            continue
        if device == "cpu" and not tiny and round_seconds(machine, shape, b, g, t, working) > CPU_ROUND_SECONDS:
            continue
        chosen = (b, g, t)
        break
    if chosen is None:  # none fits, with the values given, or in time: the smallest (the line warns)
        b, g, t = candidates[-1]
        chosen = (keep(questions, b), keep(generations, g), keep(max_new_tokens, t))
    b, g, t = chosen
    rows = b * g
    if micro_batch is None:
        micro_batch = next((m for m in MICRO_BATCHES if m <= rows and fits(b, g, t, m)), 1)
    return Fitted(
        threads=threads,
        questions=b,
        generations=g,
        max_new_tokens=t,
        micro_batch=micro_batch,
        peak=peak_bytes(shape, b, g, t, micro_batch, device),
        budget=budget,
        seconds=round_seconds(machine, shape, b, g, t, working) if device == "cpu" and not tiny else None,
        known=known,
    )


def too_small_message(model: str, machine: Machine, budget: int) -> str:
    b, g, t = ROUND_SHAPES[-1]
    need = peak_bytes(model_shape(model)[0], b, g, t, 1, machine.device)
    fitting = [
        name
        for name in ("tiny-mini", "tiny", "small", "smollm2-135m", "Qwen/Qwen2.5-0.5B-Instruct")
        if name != model and peak_bytes(MODEL_SHAPES[name], b, g, t, 1, machine.device) <= budget
    ]
    where = "on the GPU" if machine.device.startswith("cuda") else "of memory"
    return (
        f"model {model!r} needs about {need / GIB:.1f} GiB even at its smallest round (B {b}, G {g}, {t} new "
        f"tokens, micro-batch 1), and this machine has {budget / HEADROOM / GIB:.1f} GiB free {where}: "
        + (f"models that fit: {', '.join(fitting)} (--model NAME)" if fitting else "no model fits; free some memory")
    )


# ---------------------------------------------------------------------------- reading the machine


def read_machine(device: str = "auto") -> Machine:
    """This machine's facts. torch is imported only to confirm a CUDA or MPS device that the
    system shows signs of, or that the user named."""
    cores = usable_cores()
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):
        load = 0.0
    device, device_memory = _device(device)
    return Machine(cores, load, _free_memory(), device, device_memory)


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity, bounded by a container's CPU quota."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return min(cores, _cgroup_cores() or cores)


def _device(device: str) -> tuple[str, int | None]:
    if device == "cpu":
        return "cpu", None
    maybe_cuda = Path("/proc/driver/nvidia/version").exists() or any(Path("/dev").glob("nvidia[0-9]*"))
    maybe_mps = platform.system() == "Darwin" and platform.machine() == "arm64"
    if device == "auto" and not (maybe_cuda or maybe_mps):
        return "cpu", None
    from sapo_node.models import resolve_device  # imports torch

    device = resolve_device(device)
    if device.startswith("cuda"):
        import torch

        free, _total = torch.cuda.mem_get_info(torch.device(device))
        return device, int(free)
    return device, None


def _free_memory() -> int:
    free = _meminfo_available() or _darwin_free() or _sysconf_free() or 4 * GIB
    limit = _cgroup_room()
    return min(free, limit) if limit is not None else free


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_room() -> int | None:
    """What a container's memory limit (cgroup v2) leaves: memory.max less memory.current."""
    base = Path("/sys/fs/cgroup")
    try:
        limit = (base / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(0, int(limit) - int((base / "memory.current").read_text()))
    except (OSError, ValueError):
        return None


def _cgroup_cores(cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> int | None:
    """A container's CPU quota (cgroup v2 cpu.max, e.g. `200000 100000` for 2 cores), rounded up."""
    try:
        quota, period = cpu_max.read_text().split()[:2]
        return None if quota == "max" else max(1, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        return None


def _darwin_free() -> int | None:
    """macOS: free, inactive and purgeable pages (vm_stat), which the system gives without swapping."""
    if platform.system() != "Darwin":
        return None
    try:
        text = subprocess.run(["vm_stat"], capture_output=True, text=True, timeout=5, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    page, pages = 16384, 0
    for line in text.splitlines():
        if "page size of" in line:
            page = int("".join(ch for ch in line.split("page size of")[1] if ch.isdigit()) or page)
        elif line.startswith(("Pages free", "Pages inactive", "Pages purgeable")):
            pages += int(line.split(":")[1].strip().rstrip("."))
    return pages * page or None


def _sysconf_free() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def describe_fit(model: str, machine: Machine, fitted: Fitted) -> str:
    """The one line a run starts with: every automatic choice, the facts behind it, how to override."""
    where = machine.device
    if where.startswith("cuda") and machine.device_memory is not None:
        free = f"free {machine.device_memory / GIB:.1f} GiB on {where}"
    else:
        free = f"free {machine.free_memory / GIB:.1f} GiB"
    seconds = f", about {fitted.seconds:.0f} s a round" if fitted.seconds is not None else ""
    warn = (
        f"; WARNING: estimated peak {fitted.peak / GIB:.1f} GiB is over the {fitted.budget / GIB:.1f} GiB this machine can give"
        if fitted.peak > fitted.budget
        else ""
    )
    threads = f"threads {fitted.threads}" if fitted.threads else "threads 0 (all)"
    if not fitted.known:
        model += " (its config.json is not on disk yet: sized as Qwen2.5-0.5B)"
    return (
        f"config: model {model} on {where}, {threads} ({machine.cores} cores, load {machine.load:.1f}), "
        f"B {fitted.questions}, G {fitted.generations}, {fitted.max_new_tokens} new tokens, "
        f"micro-batch {fitted.micro_batch} (peak about {fitted.peak / GIB:.1f} GiB, {free}{seconds}){warn}; "
        "override with --threads/--questions/--generations/--max-new-tokens/--micro-batch"
    )
