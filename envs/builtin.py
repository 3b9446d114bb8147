"""Registration of the built-in env ids (entry points import lazily on make)."""

from rollhub.envs.registry import register


def register_builtin_envs() -> None:
    # Each area adds its ids here; keep entry points as strings so nothing heavy imports.
    pass
