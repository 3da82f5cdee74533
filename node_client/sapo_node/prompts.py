"""The one prompt format, used both to warm-start the tiny model and to generate rollouts.

A tokenizer with a chat template (a real instruction model) gets the system prompt below and the
question as the user turn. The tiny built-in tokenizer has no template and gets a compact plain
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
    "You are a careful problem solver. Reason briefly, then give your final answer inside "
    "<answer></answer> tags, for example <answer>42</answer>. Put only the answer in the tags."
)

#: What a plain (template-less) prompt ends with; the completion starts right after it.
PLAIN_ANSWER_CUE = "Answer:"


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def format_plain(question: str) -> str:
    """The compact format of the tiny model: "Question: ...\\nAnswer:" (no trailing space)."""
    return f"Question: {question.strip()}\n{PLAIN_ANSWER_CUE}"


def format_prompt(tokenizer: Any, question: str) -> str:
    """The text a policy is given for `question`; its completion is appended to it verbatim."""
    if has_chat_template(tokenizer):
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": question.strip()},
        ]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return format_plain(question)


def format_target(answer: str) -> str:
    """The warm-start completion for a plain prompt: a leading space, then the tagged answer.

    The tokenizer's end-of-sequence token follows it (added as an id, not as text).
    """
    return f" <answer>{answer.strip()}</answer>"
