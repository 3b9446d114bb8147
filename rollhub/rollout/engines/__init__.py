"""Inference engines behind one async interface (see `rollhub.rollout.engines.base`)."""

from rollhub.rollout.engines.base import Generation, InferenceEngine, SamplingParams

__all__ = ["Generation", "InferenceEngine", "SamplingParams"]
