"""Single-turn task as plain Python: rollhub calls `reward` on every reply to a prompt of prompts.jsonl.

    rollhub train examples/python_task/recipe.yaml

Each JSONL row is {"prompt": ..., "answer": ..., "solution": ...}; "solution" is optional and
lets `sft.enabled` warm-start on it (the env's scripted expert replies with it).
"""

import re


def reward(completion: str, row: dict) -> float | None:
    """1 when the last number of the reply is the row's answer, 0 for another number, None (unreadable
    reply: scored as an invalid action) when there is no number."""
    numbers = re.findall(r"-?\d+", completion)
    if not numbers:
        return None
    return 1.0 if numbers[-1] == row["answer"] else 0.0
