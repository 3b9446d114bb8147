"""rollhub: an environment hub and asynchronous RL trainer for LLM agents.

The flat top-level folders (`envs/`, `sandbox/`, `rollout/`, `trainer/`, `benchmarks/`) are
the subpackages `rollhub.envs`, ... once installed (see setup.py). Importing `rollhub` stays
cheap: nothing heavy (torch, transformers, docker) is imported here.
"""

__version__ = "0.1.0"
