"""MathTool: arithmetic with a code tool (`python` / `calculator`), on an embedded bounded
interpreter or in a sandbox container; multi-turn, verifiable, content-hash train/test split."""

from rollhub.envs.mathtool.env import MathToolEnv
from rollhub.envs.mathtool.interpreter import evaluate_expression, run_code
from rollhub.envs.mathtool.problems import KINDS, generate_problem, held_out_problems

__all__ = ["KINDS", "MathToolEnv", "evaluate_expression", "generate_problem", "held_out_problems", "run_code"]
