"""Re-grade every recorded MathTool answer with the literal-form rule, to find honest answers it refuses.

    python -m experiments.mathtool.regrade_answers [--old-answers /path/to/old/rollhub/envs/math/answers.py]

Reads the transcripts in experiments/mathtool/results/*.json (their problems are the test split's,
seed s plays entry s % 200) and the token-level episodes in experiments/mathtool/data/*.jsonl
(decoded with SmolLM2's tokenizer; the question is read from the prompt). Every `<answer>` is graded
by the evaluating checker (`is_equivalent`, or the one in `--old-answers`) and by the form rule
(`answer_is_correct` with the problem's form); prints the counts and each answer that scored 1
before and 0 now.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
from pathlib import Path
from typing import Any

from rollhub.envs.math.answer_forms import answer_is_correct
from rollhub.envs.math.answers import extract_answer, is_equivalent
from rollhub.envs.mathtool.env import MathToolEnv

HERE = Path(__file__).parent


def gold_of(question: str) -> str | None:
    """The answer of a MathTool question, from its text (the generator's templates)."""
    question = question.split(" Give the answer")[0].split(" Use the ")[0]
    match = re.fullmatch(r"Compute ([\d +*-]+)\.", question)
    if match:
        return str(eval(match.group(1)))  # noqa: S307 - our own generated arithmetic, digits and + - * only
    match = re.fullmatch(r"What is the remainder when (\d+) \* (\d+) is divided by (\d+)\?", question)
    if match:
        a, b, m = map(int, match.groups())
        return str(a * b % m)
    match = re.fullmatch(r"What is the remainder when (\d+) to the power of (\d+) is divided by (\d+)\?", question)
    if match:
        return str(pow(*map(int, match.groups())))
    numbers = [int(n) for n in re.findall(r"\d+", question)]
    if "warehouse" in question or "farm" in question:
        a, b, c = numbers if "warehouse" in question else (numbers[1], numbers[0], numbers[2])
        return str(a * b - c)
    if "tickets" in question:
        return str(numbers[0] * numbers[1] + numbers[2])
    return None


def recorded_answers() -> list[tuple[str, str, str]]:
    """(source, question, reply) of every recorded reply that holds an answer tag."""
    found: list[tuple[str, str, str]] = []
    test = MathToolEnv(split="test").problems or []

    def walk(node: Any, name: str) -> None:
        if isinstance(node, dict):
            for transcript in node.get("transcripts", []):
                question = test[transcript["seed"] % len(test)].question
                found.extend((name, question, r) for r in transcript["replies"] if "<answer>" in r)
            for value in node.values():
                walk(value, name)

    for path in sorted((HERE / "results").glob("*.json")):
        walk(json.loads(path.read_text()), path.name)
    episodes = sorted((HERE / "data").glob("*.jsonl"))
    if episodes:
        import sys

        sys.path.insert(0, str(HERE.parents[1]))
        from tests.smollm2_testing import smollm2_tokenizer

        tokenizer = smollm2_tokenizer()
        for path in episodes:
            for line in path.read_text().splitlines():
                for turn in json.loads(line)["turns"]:
                    prompt = tokenizer.decode(turn["prompt_ids"])
                    users = re.findall(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", prompt, flags=re.DOTALL)
                    reply = tokenizer.decode(turn["response_ids"]).replace("<|im_end|>", "")
                    if len(users) >= 2 and "<answer>" in reply:
                        found.append((path.name, users[1], reply))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old-answers", type=Path, default=None, help="answers.py of the code before the change")
    args = parser.parse_args()
    old_check = is_equivalent
    if args.old_answers is not None:
        spec = importlib.util.spec_from_file_location("old_answers", args.old_answers)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        old_check = module.is_equivalent
    counts = {"answers": 0, "1 before": 0, "1 now": 0, "1 before, 0 now": 0, "0 before, 1 now": 0, "no gold": 0}
    for source, question, reply in recorded_answers():
        gold = gold_of(question)
        if gold is None:
            counts["no gold"] += 1
            continue
        answer, _ = extract_answer(reply)
        before, now = bool(old_check(answer, gold)), answer_is_correct(answer, gold, "integer")
        counts["answers"] += 1
        counts["1 before"] += before
        counts["1 now"] += now
        if before and not now:
            counts["1 before, 0 now"] += 1
            print(f"REFUSED NOW  {source}: {question!r} gold {gold} answer {answer!r}")
        if now and not before:
            counts["0 before, 1 now"] += 1
            print(f"NEWLY PAID   {source}: {question!r} gold {gold} answer {answer!r}")
    print(json.dumps(counts))


if __name__ == "__main__":
    main()
