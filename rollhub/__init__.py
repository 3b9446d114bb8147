"""rollhub: an environment hub and asynchronous RL trainer for LLM agents.

Packages, lowest layer first (each imports only from those before it): `core` (config,
errors), `sandbox`, `envs`, `rollout`, `trainer`; `bench` (measurements and simulators) and
`cli` may import all of them. Importing `rollhub` stays cheap: nothing heavy (torch,
transformers, docker) is imported here.
"""

__version__ = "0.1.0"
