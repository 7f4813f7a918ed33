"""The bench's prompts: decode questions, random-id prefill prompts prefix caching cannot
serve, and the pass-key recall prompts."""

from __future__ import annotations

import random

PROMPT_ID_RANGE = (100, 1000)  # token ids every tokenizer has, far from special tokens


CHARS_PER_TOKEN = 4  # English filler; the usage chunk reports the true count


DECODE_PROMPTS = {
    "prose": (
        "Write a detailed essay of about 800 words on the history of the printing press and how it changed Europe."
    ),
    "code": (
        "Write a complete, well-commented Python module implementing a thread-safe LRU cache with per-entry "
        "expiry, followed by pytest unit tests for it."
    ),
}


RECALL_FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "


RECALL_QUESTION = "What is the pass key? Answer with the number only."


def decode_prompt(kind: str, nonce: str) -> str:
    """The kind's task after a unique first line, so no prompt is ever served from the prefix cache."""
    return f"Request {nonce}.\n{DECODE_PROMPTS[kind]}"


def prefill_ids(count: int, rng: random.Random) -> list[int]:
    return [rng.randrange(*PROMPT_ID_RANGE) for _ in range(count)]


def recall_prompt(length: int, depth: float, key: str, nonce: str) -> str:
    """The pass-key test: `key` hidden at `depth` (0 = start, 1 = end) of ~`length` tokens of filler."""
    intro = f"Session {nonce}. A pass key is hidden in the long text below. Find it and remember it.\n\n"
    needle = f"The pass key is {key}. Remember it. {key} is the pass key. "
    question = f"\n\n{RECALL_QUESTION}"
    room = length * CHARS_PER_TOKEN - len(intro) - len(needle) - len(question)
    units = max(1, room // len(RECALL_FILLER))
    before = round(units * min(1.0, max(0.0, depth)))
    return intro + RECALL_FILLER * before + needle + RECALL_FILLER * (units - before) + question
