"""The node protocol's shared vocabulary (docs/protocol.md): version, message types, error codes,
close codes, limit names and their defaults, and the wire form of a group; one module for the node
client and the server (sockets.messages, sockets.consumers, pool.limits, pool.services, nodes.events and
config.settings import it). Constants and msgspec Structs, no other dependency: the server imports
it, and it imports nothing of the server's (tests/test_layers.py checks both)."""

from __future__ import annotations

import uuid

import msgspec

#: The limits the server announces in `welcome.limits`, with their defaults (docs/protocol.md,
#: "Limits"). pool.limits.Limits has exactly these fields and defaults; a deployment sets each with
#: the variable SAPO_<NAME>, read once in config/settings.py. The node client shapes its frames by
#: the first six until the server's welcome says otherwise.
DEFAULT_LIMITS: dict[str, int] = {
    "max_frame_bytes": 1_048_576,
    "max_groups_per_message": 64,
    "max_completions_per_group": 32,
    "max_chars_per_completion": 8192,
    "max_sample_n": 64,
    "max_used_per_report": 1024,
    "max_messages_per_minute": 600,
    "max_bytes_per_minute": 8 * 1024 * 1024,
    "max_cpu_ms_per_minute": 3_000,
    "max_consecutive_errors": 20,
    "sample_window_seconds": 86_400,
    "max_stored_bytes_per_node_hour": 64 * 1024 * 1024,
    "max_stored_bytes_per_contributor_hour": 256 * 1024 * 1024,
}
LIMIT_NAMES = tuple(DEFAULT_LIMITS)

#: A group's id is a UUIDv7 (sapo_node.ids) whose time is at most ID_MAX_AGE_SECONDS before the
#: server's clock and at most ID_MAX_AHEAD_SECONDS after it (docs/protocol.md, "share"). The age covers
#: a node's resend of what a restored pool lost (outbox.ACK_RETENTION_SECONDS, 3 days) with room.
ID_MAX_AGE_SECONDS = 7 * 86_400
ID_MAX_AHEAD_SECONDS = 300
#: The verdict reason of a group whose id breaks that rule and that the pool does not hold: nothing is
#: stored or counted, and the node shares the group again under a fresh id (outbox.rekey).
BAD_ID = "bad_id"

#: Non-printable characters, as inclusive code point ranges: controls other than tab, newline and
#: carriage return, zero-width and bidi marks, the BOM. The moderation's characters rule counts them
#: (moderation.kernels) and the node's sampler never writes them (sapo_node.generate).
NONPRINTABLE = (
    (0x00, 0x08),
    (0x0B, 0x0C),
    (0x0E, 0x1F),
    (0x7F, 0x9F),
    (0x200B, 0x200F),
    (0x202A, 0x202E),
    (0x2060, 0x2064),
    (0xFEFF, 0xFEFF),
)

#: The protocol version every frame carries as "v"; a frame with another is answered `unsupported_version`.
VERSION = 1

# Message types, node -> server.
HELLO = "hello"
SHARE = "share"
SAMPLE = "sample"
REPORT = "report"
#: What the node is doing ("state": one of NODE_STATES), its last round's seconds and tokens per second,
#: and the reasons it is paused for (`paused_for`, PAUSE_SITE among them once it obeys a site pause).
#: Sent only to a server whose welcome has "paused" (an older one answers unknown_type).
STATUS = "status"
#: A node's greedy answers to a held-out check the server asked of it (`heldout_check`): "check", "round",
#: "answers" ([{"id", "text"}], one per question asked). Sent only by a node whose hello said `heldout`.
HELDOUT_ANSWERS = "heldout_answers"
NODE_MESSAGES = (HELLO, SHARE, SAMPLE, REPORT, STATUS, HELDOUT_ANSWERS)

# Message types, server -> node ("ack" carries "for": SHARE, REPORT or STATUS).
WELCOME = "welcome"
ACK = "ack"
SAMPLES = "samples"
ERROR = "error"
#: The node's swarm was opened, paused or retired while it was connected ("state", "swarm", "detail").
SWARM_STATE = "swarm_state"
#: The node's owner paused it, or resumed it, from the site ("paused": true or false). A client older than
#: this message ignores it (a frame of unknown type) and keeps working; the site then says so.
PAUSE = "pause"
#: A held-out check (WireHeldoutCheck): a few questions of the swarm's held-out stream, to answer greedily
#: with the node's current policy before the deadline. Only to a node whose hello said `heldout`.
HELDOUT_CHECK = "heldout_check"
SERVER_MESSAGES = (WELCOME, ACK, SAMPLES, ERROR, SWARM_STATE, PAUSE, HELDOUT_CHECK)

#: A node's states, as `status.state` says them: loading or building its model, playing rounds,
#: waiting on its pause gate (sapo_node.pause), connected with no round to play (its rounds are done).
NODE_PREPARING = "preparing"
NODE_TRAINING = "training"
NODE_PAUSED = "paused"
NODE_IDLE = "idle"
NODE_STATES = (NODE_PREPARING, NODE_TRAINING, NODE_PAUSED, NODE_IDLE)
#: While a node is preparing, what it is doing (`status.preparing`: one of PREPARING_STEPS), how far it is
#: (`progress`, 0 to 1) and the seconds it expects that to take still (`eta_seconds`), each when known.
PREPARING_LOAD = "load"
PREPARING_DOWNLOAD = "download"
PREPARING_BUILD = "build"
PREPARING_STEPS = (PREPARING_LOAD, PREPARING_DOWNLOAD, PREPARING_BUILD)
#: The pause reason a `pause` frame sets (sapo_node.pause.PauseGate); a status's `paused_for` has at most
#: MAX_PAUSE_REASONS reasons of at most MAX_PAUSE_REASON_CHARS characters each.
PAUSE_SITE = "site"
MAX_PAUSE_REASONS = 8
MAX_PAUSE_REASON_CHARS = 32
#: Bounds of a status's figures (sockets.messages refuses a value outside them as invalid_message).
MAX_ROUND_SECONDS = 7 * 86_400.0
MAX_TOKENS_PER_SECOND = 10_000_000.0

#: What `hello.swarm` may say instead of a swarm's slug: let the server choose (docs/protocol.md).
ANY_SWARM = "any"
#: A swarm's states, as `welcome.swarm.state` and `swarm_state.state` say them.
STATE_OPEN = "open"
STATE_PAUSED = "paused"
STATE_RETIRED = "retired"

# Error codes: an `error` frame's "code" (docs/protocol.md, "Errors"). The frame is refused whole and
# nothing of it is stored; the socket stays open.
INVALID_JSON = "invalid_json"  # not a JSON object: not JSON, not UTF-8, nested too deep
UNSUPPORTED_VERSION = "unsupported_version"  # "v" missing or not VERSION
UNKNOWN_TYPE = "unknown_type"  # "type" not one of NODE_MESSAGES
INVALID_MESSAGE = "invalid_message"  # a field missing, of the wrong type or an impossible value
FRAME_TOO_LARGE = "frame_too_large"  # over max_frame_bytes
TOO_MANY_GROUPS = "too_many_groups"  # over max_groups_per_message
TOO_MANY_COMPLETIONS = "too_many_completions"  # over max_completions_per_group
COMPLETION_TOO_LONG = "completion_too_long"  # a completion, question or answer over max_chars_per_completion
TOO_MANY_SAMPLES = "too_many_samples"  # sample.n over max_sample_n
TOO_MANY_USED = "too_many_used"  # report.used over max_used_per_report
RATE_LIMITED = "rate_limited"  # over the node's message, byte or CPU budget: not now, later
OVER_BUDGET = "over_budget"  # the hourly storage budget of the node or its contributor is used up
INTERNAL_ERROR = "internal_error"  # the server failed while handling the frame
UNKNOWN_SWARM = "unknown_swarm"  # hello names no swarm of this site (then closed with CLOSE_UNKNOWN_SWARM)
SWARM_RETIRED = "swarm_retired"  # hello names a retired swarm (then closed with CLOSE_SWARM_RETIRED)
SWARM_PAUSED = "swarm_paused"  # a share or sample while the node's swarm is paused: train in silo meanwhile
HELDOUT_UNASKED = "heldout_unasked"  # heldout_answers for a check or a question the server did not ask this socket
HELDOUT_LATE = "heldout_late"  # heldout_answers after the check's deadline
HELDOUT_DUPLICATE = "heldout_duplicate"  # heldout_answers for a check already answered, or a question twice
ERROR_CODES = (
    INVALID_JSON,
    UNSUPPORTED_VERSION,
    UNKNOWN_TYPE,
    INVALID_MESSAGE,
    FRAME_TOO_LARGE,
    TOO_MANY_GROUPS,
    TOO_MANY_COMPLETIONS,
    COMPLETION_TOO_LONG,
    TOO_MANY_SAMPLES,
    TOO_MANY_USED,
    RATE_LIMITED,
    OVER_BUDGET,
    INTERNAL_ERROR,
    UNKNOWN_SWARM,
    SWARM_RETIRED,
    SWARM_PAUSED,
    HELDOUT_UNASKED,
    HELDOUT_LATE,
    HELDOUT_DUPLICATE,
)

# WebSocket close codes the server uses (and HTTP statuses at the upgrade map onto the first two).
CLOSE_UNAUTHENTICATED = 4401  # no/bad token, tokens revoked, node retired: retrying cannot help
CLOSE_BANNED = 4403  # the node or its contributor is banned
CLOSE_TOO_MANY_ERRORS = 4429  # max_consecutive_errors error replies in a row
CLOSE_TRY_AGAIN = 4503  # the server could not open the session now (its database or Redis failed): retry later
CLOSE_UNKNOWN_SWARM = 4404  # hello named no swarm of this site: retrying cannot help
CLOSE_SWARM_RETIRED = 4410  # the node's swarm is retired (at hello, or while connected): retrying cannot help
#: Every close code the server sends itself. An application may send only 1000 or 3000-4999 (RFC 6455
#: 7.4.2; autobahn, under daphne, raises on any other, e.g. 1011, and the node then gets daphne's
#: own 1011 for an unhandled exception instead); tests/platform/test_close_codes.py holds them to it.
SERVER_CLOSE_CODES = (
    CLOSE_UNAUTHENTICATED,
    CLOSE_BANNED,
    CLOSE_TOO_MANY_ERRORS,
    CLOSE_TRY_AGAIN,
    CLOSE_UNKNOWN_SWARM,
    CLOSE_SWARM_RETIRED,
)
#: HTTP answers to the upgrade after which retrying cannot help. Not 403: daphne answers 403 to a
#: handshake its application did not accept within --websocket_connect_timeout (a server busy with a
#: crowd of reconnecting nodes), and the platform refuses a banned node after accepting (close 4403).
HTTP_REFUSALS = {401: CLOSE_UNAUTHENTICATED}


class WireTask(msgspec.Struct, kw_only=True):
    """A group's task: the dataset, and the (seed, index) that rebuild its question."""

    dataset: str
    seed: int
    index: int


class WireProof(msgspec.Struct, kw_only=True):
    """What a group made under a server challenge carries to prove its work (docs/protocol.md, "Proof of
    work"; the encodings are sapo_node.proof's): the challenge its question came from, the commitment
    to the generating weights, and each completion's sampled token ids and their log-probabilities,
    which an audit replays under the committed weights."""

    #: The challenge (`welcome.challenge`, `ack.challenge`) the group's question came from.
    challenge: str
    #: proof.weights_digest of the weights that generated the group: 64 lowercase hex characters.
    weights: str
    #: The model's name as `hello.model` says it (tiny-mini, smollm2, ...).
    model: str
    temperature: float
    #: Per completion: proof.encode_ids of its sampled token ids, EOS included.
    tokens: list[str]
    #: Per completion: proof.encode_floats of each sampled token's log-probability (one per token).
    logprobs: list[str]


#: A proof's bounds (sockets.messages refuses a proof outside them as invalid_message): the model's name in
#: characters, the temperature's range.
PROOF_MAX_MODEL_CHARS = 200
PROOF_MAX_TEMPERATURE = 10.0


class WireAudit(msgspec.Struct, kw_only=True):
    """An audit the server asks of the node (`ack.audits`, `welcome.audits`; docs/protocol.md, "Proof of
    work"): upload the checkpoint whose weights_digest is `weights` to `upload` (a path on the server)
    before `deadline` (unix seconds)."""

    id: uuid.UUID
    weights: str
    upload: str
    deadline: int


class WireGroup(msgspec.Struct, kw_only=True):
    """A group as it travels (docs/protocol.md, "share"), declared once: the node client encodes and
    decodes through it (sapo_node.groups.Group.to_wire/from_wire), the server decodes a share into it
    (sockets.messages' typed path) and names a group's fields by it wherever it holds one. Each side keeps
    its own bounds.

    A field is added here (with a default when older nodes do not send it), plus its validation in
    sockets.messages (a check in `_GROUP_CHECKS`, a field of RolloutIn, the typed path's bound) and its
    column where the pool stores it (a model field of its name, the INSERT, a field of
    pool.payloads.SampledGroup): an import-time assert fails until each has it (docs/architecture.md,
    "Add a field to a shared group"). A node that makes or reads the field carries it in
    sapo_node.groups.Group."""

    id: uuid.UUID
    round: int
    task: WireTask
    question: str
    #: None for tasks that have no single answer.
    answer: str | None
    completions: list[str]
    rewards: list[float]
    #: None from a node without a challenge (offline, or an older client): the group is unaudited.
    proof: WireProof | None = None


class SampledWireGroup(WireGroup, kw_only=True):
    """A group as a `samples` reply carries it: its rewards are the verified ones, and `node` is its
    author node's public name (which the server always writes)."""

    node: str | None = None


#: The held-out stream's dataset seed (docs/protocol.md, "heldout_check"): the server's checks ask
#: questions of it, the export's card and the studies evaluate on it (sapo_node.tiny's EVAL_SEED is the
#: same seed); a node's own stream never takes it (sapo_node.tasks.TaskStream) and the pool refuses a
#: group of it (pool.verification), so no node trains on its questions.
HELDOUT_SEED = 987_654
#: A held-out check's bounds, both sides: questions per check, tokens per answer. The server asks fewer
#: (its settings); a node ignores a check outside them.
HELDOUT_MAX_QUESTIONS = 16
HELDOUT_MAX_NEW_TOKENS = 512


class WireHeldoutQuestion(msgspec.Struct, kw_only=True):
    """One question of a held-out check: its number in the check, its dataset (for the prompt's
    vocabulary and the page's breakdown) and its text."""

    id: int
    dataset: str
    question: str


class WireHeldoutCheck(msgspec.Struct, kw_only=True):
    """A held-out check as `heldout_check` carries it (docs/protocol.md, "heldout_check")."""

    check: uuid.UUID
    questions: list[WireHeldoutQuestion]
    #: The most tokens an answer may take (the node takes the lower of this and its own max_new_tokens).
    max_new_tokens: int
    #: Unix seconds after which the server refuses the answers (heldout_late).
    deadline: float


def frame(kind: str, **fields: object) -> dict[str, object]:
    """A frame of this protocol version: {"type": kind, "v": VERSION, **fields}."""
    return {"type": kind, "v": VERSION, **fields}
