"""The reward of an agent that does no work: it copies the question's expression into `<answer>`.

    PYTHONPATH=<checkout> python -m experiments.mathtool.echo_score [SEEDS]   (or run the file by path)

For every problem kind of Math-v0 and MathTool-v0 (default settings), over SEEDS seeds (200):
`echo` is the share of problems where the expression itself scores 1, `any shape` where at least
one of its shapes does (spaces removed, parenthesised, `=` appended, `int(...)`, `**` for `^`;
a word problem's own text and its numbers in the story's arithmetic). Runs on any checkout, so
the same command measures the code before and after a change.
"""

from __future__ import annotations

import asyncio
import re
import sys

import rollhub.envs as envs

ENVS = {
    "rollhub/Math-v0": ("arithmetic", "linear_equation", "fraction", "word"),
    "rollhub/MathTool-v0": ("product", "sum", "expression", "modular", "word"),
}


def echoes(question: str) -> list[str]:
    """The question's expression in the shapes listed in the module docstring; the first is itself."""
    question = question.split(" Give the answer")[0].split(" Use the ")[0]
    expressions = []
    for pattern in (r"Compute (.*)\.$", r"Solve for x: (.*)\.$"):
        match = re.match(pattern, question)
        if match:
            expressions.append(match.group(1))
    match = re.match(r"What is the remainder when (.*) is divided by (\d+)\?$", question)
    if match:
        left, modulus = match.groups()
        power = re.fullmatch(r"(\d+) to the power of (\d+)", left)
        if power:
            base, exponent = power.groups()
            expressions += [f"{base}**{exponent} % {modulus}", f"pow({base}, {exponent}, {modulus})"]
        else:
            expressions += [f"{left} % {modulus}", f"({left}) % {modulus}"]
    if not expressions:  # a word problem
        a, b, c = (re.findall(r"\d+", question) + ["1", "1", "1"])[:3]
        expressions += [question, f"{a} * {b} - {c}", f"{a} * {b} + {c}", f"{a} + {b} * {c} - {int(a) // 2}"]
    shapes = []
    for e in expressions:
        shapes += [e, e.replace(" ", ""), f"({e})", f"{e} =", f"{e}=", f"int({e})", e.replace("^", "**")]
    return shapes


async def main(seeds: int) -> None:
    for env_id, kinds in ENVS.items():
        plain_total = any_total = 0
        for kind in kinds:
            env = envs.make(env_id, kinds=(kind,))
            plain = any_shape = 0
            for seed in range(seeds):
                await env.reset(seed=seed)
                rewards = []
                for shape in echoes(env.unwrapped.problem.question):
                    await env.reset(seed=seed)
                    rewards.append((await env.step(f"<answer>{shape}</answer>"))[1])
                plain += rewards[0] == 1.0
                any_shape += max(rewards) == 1.0
            plain_total, any_total = plain_total + plain, any_total + any_shape
            print(f"{env_id:20s} {kind:16s} echo {plain / seeds:6.1%}   any shape {any_shape / seeds:6.1%}")
        n = seeds * len(kinds)
        print(f"{env_id:20s} {'all kinds':16s} echo {plain_total / n:6.1%}   any shape {any_total / n:6.1%}")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 200))
