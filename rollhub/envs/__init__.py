"""rollhub.envs: the env contract, the registry and the built-in envs.

    import rollhub.envs as envs
    env = envs.make("rollhub/Sokoban-v0")

Built-in envs register here by id; their modules import lazily on `make`, so an env whose
optional extra is missing still shows in `rollhub envs list`.
"""

from rollhub.envs.base import Env, Message, Observation, extract_action, wrap_action
from rollhub.envs.python_task import from_function
from rollhub.envs.registry import EnvSpec, all_specs, make, register, spec
from rollhub.envs.wrappers import EnvWrapper

__all__ = [
    "Env",
    "EnvSpec",
    "EnvWrapper",
    "Message",
    "Observation",
    "all_specs",
    "extract_action",
    "from_function",
    "make",
    "register",
    "spec",
    "wrap_action",
]

from rollhub.envs import builtin as _builtin  # noqa: E402  (registers the built-in ids)

_builtin.register_builtin_envs()
