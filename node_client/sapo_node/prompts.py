"""The one prompt format, used both to warm-start the tiny model and to generate rollouts.

A tokenizer with a chat template (a real instruction model) gets the system prompt below, a few
worked turns (FEW_SHOT) and the question as the last user turn. A small instruct model told the format
in the system message alone answers bare ("8", "Yes."): SmolLM2-135M-Instruct put no answer in tags
at all; shown three short turns that end in tags, it does for most questions (docs/node.md, "Answers
a real model gives"). The turns are generic (not drawn from any catalogue), so no question's answer
is given away. The tiny built-in tokenizer has no template and gets a compact plain
format that ends in "Answer:"; its completions then begin with a space (" <answer>...</answer>"),
so the prompt/completion boundary falls between two pre-tokens and encoding the prompt and the
completion separately gives the same ids as encoding them together. (A prompt ending in a space
would instead merge that space into the completion's first token and silently break training.)

Completions are scored by `sapo_node.tasks.score_completion`, which reads the last
<answer>...</answer> of the completion.
"""

from __future__ import annotations

from typing import Any

SYSTEM_PROMPT = (
    "You are a careful problem solver. Reason briefly, then always end with your final answer inside "
    "<answer></answer> tags, for example <answer>42</answer>. Put only the answer in the tags."
)

#: Worked (user, assistant) turns before the question: one per kind of answer the catalogues ask
#: for (a number, Yes/No, a fraction), each reasoning in one line and ending in tags.
FEW_SHOT: tuple[tuple[str, str], ...] = (
    ("What is 12 + 7?", "12 + 7 = 19\n<answer>19</answer>"),
    ("Is 7 an even number? Answer Yes or No.", "7 is odd.\n<answer>No</answer>"),
    ("Simplify the fraction 6/8.", "6/8 = 3/4\n<answer>3/4</answer>"),
)

#: What a plain (template-less) prompt ends with; the completion starts right after it.
PLAIN_ANSWER_CUE = "Answer:"


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def format_plain(question: str) -> str:
    """The compact format of the tiny model: "Question: ...\\nAnswer:" (no trailing space)."""
    return f"Question: {question.strip()}\n{PLAIN_ANSWER_CUE}"


def chat_messages(question: str, few_shot: bool = True) -> list[dict[str, str]]:
    """The system message, the worked turns (unless `few_shot` is False) and the question."""
    messages = [{"role": "system", "content": SYSTEM_PROMPT}]
    for user, assistant in FEW_SHOT if few_shot else ():
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    return [*messages, {"role": "user", "content": question.strip()}]


def format_prompt(tokenizer: Any, question: str, few_shot: bool = True) -> str:
    """The text a policy is given for `question`; its completion is appended to it verbatim.

    `few_shot=False` leaves out the worked turns (bench/answers.py compares the two)."""
    if has_chat_template(tokenizer):
        messages = chat_messages(question, few_shot)
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return format_plain(question)


def format_target(answer: str) -> str:
    """The warm-start completion for a plain prompt: a leading space, then the tagged answer.

    The tokenizer's end-of-sequence token follows it (added as an id, not as text).
    """
    return f" <answer>{answer.strip()}</answer>"
