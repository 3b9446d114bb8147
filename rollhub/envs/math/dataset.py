"""Load GSM8K- or MATH-style problems from JSON lines.

Each line is an object with a question and an answer. Field names default to the first
present of ("question", "problem") and ("answer", "solution"). The gold answer is the text
after the last `####` (GSM8K), else the last `\\boxed{}` (MATH), else the whole field.
"""

from __future__ import annotations

import json
from pathlib import Path

from rollhub.envs.math.answers import extract_boxed
from rollhub.envs.math.problems import Problem

QUESTION_KEYS = ("question", "problem")
ANSWER_KEYS = ("answer", "solution")


def gold_answer(answer_field: str) -> str:
    """The final answer inside a worked solution."""
    if "####" in answer_field:
        return answer_field.rsplit("####", 1)[1].strip()
    boxed = extract_boxed(answer_field)
    return boxed if boxed is not None else answer_field.strip()


def load_jsonl(path: str | Path, *, question_key: str | None = None, answer_key: str | None = None) -> list[Problem]:
    """All problems in `path`; raises ValueError naming the line for bad input."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"math dataset not found: {path} (expected JSON lines with question and answer fields)")
    problems = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{number}: each line must be a JSON object")
            q_key = question_key or next((k for k in QUESTION_KEYS if k in row), None)
            a_key = answer_key or next((k for k in ANSWER_KEYS if k in row), None)
            if q_key not in row or a_key not in row:
                raise ValueError(
                    f"{path}:{number}: missing question/answer fields; found {sorted(row)}; "
                    "pass question_key= and answer_key= to name them"
                )
            problems.append(Problem(str(row[q_key]).strip(), gold_answer(str(row[a_key]))))
    if not problems:
        raise ValueError(f"{path} holds no problems")
    return problems
