"""Step 5 of a round: the training set T = I own groups + J groups from the swarm's pool.

Nothing another node sent is trusted: an external group's question and answer must be the ones its
(dataset, seed, index) rebuilds from this node's catalogue, every completion is re-scored with this
node's verifier, and the text is tokenised with this node's own prompt format and tokenizer (so
nodes with different models and tokenizers learn from each other's text). Groups whose rewards all
agree carry no advantage and are dropped before sampling.

`ExternalRules` go further (docs/node.md, "Corrected and gated sharing"): an external group keeps
its sharer's per-token log-probabilities when they apply to this node's tokens (for the update's
importance correction), is dropped without a verified-correct completion (success gate), and is
chosen first when its reward mean lies in the learning zone.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sapo_node.baseline import OwnBaseline
from sapo_node.generate import Generated, encode_prompt
from sapo_node.groups import (
    PLAIN_RULES,
    ExternalRules,
    Group,
    TrainGroup,
    has_success,
    in_learning_zone,
    sharer_logprobs,
)
from sapo_node.sample import entry_answer
from sapo_node.tasks import Catalogue, ScoringTimeout, TaskError, build_entry, score_completions


@dataclass
class AssembleStats:
    local_offered: int = 0
    local_kept: int = 0
    external_offered: int = 0
    external_kept: int = 0
    #: External groups that failed re-verification (unknown task, question or answer mismatch, a
    #: completion that ran out of time).
    external_invalid: int = 0
    #: External completions whose claimed reward differed from this node's score.
    external_rescored: int = 0
    #: Groups dropped because all their rewards agree (own and external).
    zero_advantage: int = 0
    #: This node's scores of every completion of the external groups that verified (kept or not).
    external_rewards: list[float] = field(default_factory=list)
    reasons: dict[str, int] = field(default_factory=dict)
    #: External groups that carry their sharer's log-probabilities for this node's tokens.
    external_corrected: int = 0
    #: External groups whose log-probabilities do not apply, by why (groups.sharer_logprobs' reasons).
    external_uncorrected: dict[str, int] = field(default_factory=dict)
    #: External groups dropped by the success gate (no verified-correct completion).
    external_no_success: int = 0

    @property
    def zero_advantage_share(self) -> float:
        offered = self.local_offered + self.external_offered - self.external_invalid
        return self.zero_advantage / offered if offered else 0.0


def local_train_group(group: Group, generated: Generated) -> TrainGroup:
    """An own group keeps the exact token ids it was sampled as."""
    return TrainGroup(group.id, "local", generated.prompt_ids, generated.completion_ids, list(group.rewards))


def external_train_group(
    group: Group,
    *,
    catalogue: Catalogue,
    tokenizer: Any,
    format_prompt: Callable[[Any, str], str],
    max_tokens: int,
) -> TrainGroup:
    """Re-verify, re-score and re-tokenise a group from the pool; raises TaskError if it does not verify.

    The cheap checks (task known, question and answer the ones the task rebuilds) come first, so a
    forged group costs no scoring; the scoring is the bounded one of sapo_node.verifiers, and a
    completion that runs out of time in its sandbox drops the group (`verification_timeout`)."""
    spec = catalogue.get(group.task.dataset)
    if spec is None:
        raise TaskError("unknown_task", f"{group.task.dataset!r} is not in catalogue {catalogue.name!r}")
    entry = build_entry(spec, group.task.seed, group.task.index)
    if str(entry["question"]) != group.question:
        raise TaskError("question_mismatch", "the question is not the one its task rebuilds")
    if entry_answer(entry) != group.answer:
        raise TaskError("answer_mismatch", "the answer is not the one its task rebuilds")
    try:
        rewards = score_completions(spec, group.task.seed, entry, group.completions)
    except ScoringTimeout as exc:
        raise TaskError(exc.code, str(exc)) from exc

    prompt_ids = encode_prompt(tokenizer, format_prompt(tokenizer, entry["question"]))
    # No EOS is appended: the text does not say whether the sender's model stopped or was cut off at
    # its max-new-tokens, and an EOS after a cut-off completion would teach this node to stop
    # mid-answer. This node learns when to stop from its own rollouts; an overlong text is cut.
    completion_ids = [
        list(tokenizer(text, add_special_tokens=False)["input_ids"])[:max_tokens] for text in group.completions
    ]
    rescored = sum(abs(a - b) > 1e-6 for a, b in zip(rewards, group.rewards, strict=True))
    return TrainGroup(
        group.id, "external", prompt_ids, completion_ids, rewards, extra={"rescored": rescored, "node": group.node}
    )


def assemble(
    own: list[tuple[Group, Generated]],
    external: list[Group],
    *,
    n_local: int,
    n_external: int,
    rng: random.Random,
    catalogue: Catalogue,
    tokenizer: Any,
    format_prompt: Callable[[Any, str], str],
    max_tokens: int,
    baseline: OwnBaseline | None = None,
    rules: ExternalRules = PLAIN_RULES,
) -> tuple[list[TrainGroup], AssembleStats]:
    """Up to `n_local` informative own groups and up to `n_external` informative external ones,
    each sampled uniformly at random (external ones in the learning zone first). With `baseline`, an
    external group's completions are judged against this node's own reward on its task
    (sapo_node.baseline) instead of the group's mean."""
    stats = AssembleStats(local_offered=len(own), external_offered=len(external))
    local = [local_train_group(g, gen) for g, gen in own]

    checked: list[TrainGroup] = []
    for group in external:
        try:
            tg = external_train_group(
                group, catalogue=catalogue, tokenizer=tokenizer, format_prompt=format_prompt, max_tokens=max_tokens
            )
        except TaskError as exc:
            stats.external_invalid += 1
            stats.reasons[exc.code] = stats.reasons.get(exc.code, 0) + 1
            continue
        if baseline is not None:
            tg.baseline = baseline.get(group.task.dataset)
        stats.external_rescored += tg.extra["rescored"]
        stats.external_rewards.extend(tg.rewards)
        if rules.success_gate and not has_success(tg.rewards):
            stats.external_no_success += 1
            continue
        if rules.use_logprobs:
            tg.sharer_logprobs, why = sharer_logprobs(group, tg.completion_ids, model=rules.model)
            if tg.sharer_logprobs is None:
                stats.external_uncorrected[why] = stats.external_uncorrected.get(why, 0) + 1
                if rules.mismatch == "skip":
                    continue
            else:
                stats.external_corrected += 1
        checked.append(tg)

    informative_local = [g for g in local if g.informative]
    informative_external = [g for g in checked if g.informative]
    stats.zero_advantage = (len(local) - len(informative_local)) + (len(checked) - len(informative_external))
    chosen_local = rng.sample(informative_local, min(n_local, len(informative_local)))
    # Without a zone every group is inside it: the one draw is the plain uniform one.
    inside = [g for g in informative_external if in_learning_zone(g.rewards, *rules.zone)]
    outside = [g for g in informative_external if not in_learning_zone(g.rewards, *rules.zone)]
    chosen_external = rng.sample(inside, min(n_external, len(inside)))
    chosen_external += rng.sample(outside, min(n_external - len(chosen_external), len(outside)))
    stats.local_kept, stats.external_kept = len(chosen_local), len(chosen_external)
    return chosen_local + chosen_external, stats
