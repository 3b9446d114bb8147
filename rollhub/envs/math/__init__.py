"""Math (RLVR): procedural and jsonl problems, answer extraction, bounded-cost equivalence."""

from rollhub.envs.math.answers import extract_answer, is_equivalent, normalize
from rollhub.envs.math.dataset import load_jsonl
from rollhub.envs.math.env import MathEnv
from rollhub.envs.math.problems import KINDS, Problem, generate_problem

__all__ = [
    "KINDS",
    "MathEnv",
    "Problem",
    "extract_answer",
    "generate_problem",
    "is_equivalent",
    "load_jsonl",
    "normalize",
]
