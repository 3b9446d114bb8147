"""Single-turn task as plain Python: rollhub calls `reward` on every reply to a prompt of prompts.jsonl.

    rollhub train examples/python_task/recipe.yaml

Each JSONL row is {"prompt": ..., "answer": ..., "solution": ...}; "solution" is optional and
lets `sft.enabled` warm-start on it (the env's scripted expert replies with it).
"""

import re


def reward(completion: str, row: dict) -> float | None:
    """1 when the reply is the row's answer and nothing else (a trailing full stop is fine), 0 for any
    other reply holding a number, None (unreadable: scored as an invalid action) when it holds none.

    Only the number itself pays: a reward that read "the last number of the reply" would pay for
    echoing "What is 0 + 4?", and `rollhub.envs.checker.check_env` reports such a reward as hackable."""
    if not re.search(r"\d", completion):
        return None
    answer = re.fullmatch(r"\s*(-?\d+)\.?\s*", completion)
    return 1.0 if answer is not None and answer.group(1) == row["answer"] else 0.0
