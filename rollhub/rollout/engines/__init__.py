"""Inference engines behind one async interface (see base.py)."""

from rollhub.rollout.engines.base import Generation, InferenceEngine, SamplingParams

__all__ = ["Generation", "InferenceEngine", "SamplingParams"]
