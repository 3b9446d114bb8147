"""A small verifiers environment, built from the package's own classes (`vf.MultiTurnEnv`,
`vf.XMLParser`, `vf.Rubric`), that the adapter tests, `rollhub envs list` and the performance
cards use as the verifiers sample: `verifiers:rollhub.envs.adapters.samples_verifiers`.

Guess the number: the answer is 1..16; after each `<guess>N</guess>` the env says higher or
lower; the rubric pays 1 for a found number. Its dataset is made here, so nothing downloads.
"""

from __future__ import annotations

from typing import Any

import verifiers as vf
from datasets import Dataset

RULES = "Guess my number between 1 and 16. Answer with <guess>N</guess>; I will say higher or lower."


class GuessNumberEnv(vf.MultiTurnEnv):
    async def env_response(self, messages: Any, state: Any, **kwargs: Any) -> Any:
        guess = self.parser.parse_answer(messages)
        answer = int(state["answer"])
        try:
            value = int(str(guess).strip())
        except ValueError:
            return [vf.UserMessage(content=f"{guess!r} is not a number. {RULES}")]
        if value == answer:
            state["solved"] = True
            reply = [vf.UserMessage(content="Correct!")]
            state["final_env_response"] = reply  # verifiers ends the rollout on its final reply
            return reply
        return [vf.UserMessage(content="Higher." if value < answer else "Lower.")]

    @vf.stop
    async def solved(self, state: Any) -> bool:
        return bool(state.get("solved"))


def found(state: Any, **kwargs: Any) -> float:
    return 1.0 if state.get("solved") else 0.0


def load_environment(size: int = 32, max_turns: int = 6, **kwargs: Any) -> GuessNumberEnv:
    rows = [{"question": RULES, "answer": str(1 + (7 * i + 3) % 16)} for i in range(size)]
    parser = vf.XMLParser(["guess"], answer_field="guess")
    return GuessNumberEnv(
        dataset=Dataset.from_list(rows),
        eval_dataset=Dataset.from_list(rows[: max(1, size // 4)]),
        parser=parser,
        rubric=vf.Rubric(funcs=[found], weights=[1.0], parser=parser),
        max_turns=max_turns,
        **kwargs,
    )
