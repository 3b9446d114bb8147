"""Inference engines behind one async interface (see `rollhub.inference.engines.base`)."""

from rollhub.inference.engines.base import Generation, InferenceEngine, SamplingParams

__all__ = ["Generation", "InferenceEngine", "SamplingParams"]
