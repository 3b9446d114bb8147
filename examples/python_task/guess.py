"""Multi-turn task as plain Python: a guessing game where rollhub calls `step` after every reply.

    rollhub train examples/python_task/recipe.yaml --set env.id=python:examples/python_task/guess.py:step \
      --set env.kwargs.dataset=guess_prompts.jsonl --set eval.env.kwargs.dataset=guess_held_out.jsonl
"""

import re

#: check_env's battery wins 1 game in 8 by answering the prompt's first number ("from 1 to 8"): that is
#: a first guess, which the game is (the hints pay nothing; only naming the secret does)
HACKABILITY_NOTE = "guessing game: any number from 1 to 8 is a guess, and the first one wins 1 game in 8"


def step(history: list[dict], row: dict) -> tuple[str, float | None, bool]:
    """(feedback, reward, done) for the model's last message: hints until it names the secret; a reply
    without a number is unreadable (reward None: an invalid action)."""
    numbers = re.findall(r"\d+", history[-1]["content"])
    if not numbers:
        return "Reply with one number from 1 to 8.", None, False
    guess = int(numbers[-1])
    if guess == row["secret"]:
        return "", 1.0, True
    return ("Higher." if guess < row["secret"] else "Lower."), 0.0, False
