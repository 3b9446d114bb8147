"""Env registry: versioned ids (`rollhub/Name-vN`), `register`/`make`, plugin entry points.

An id may also register wrappers by the env kwarg that switches each on (`wrappers=`):
`make(id, min_solution_steps=5)` builds the env without that kwarg and wraps it, as
`gymnasium.make(id, max_episode_steps=N)` wraps in a time limit; a recipe's `env.kwargs`
name wrappers and constructor arguments alike.

Third-party packages expose envs through the entry-point group `rollhub.envs`; each entry
point names a module or a zero-argument callable that calls `register(...)`. Plugins load
lazily on the first lookup, so importing rollhub stays cheap, and a broken plugin is logged
and skipped rather than breaking every other env.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rollhub.core.errors import MissingExtraError, UserError

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "rollhub.envs"
ID_PATTERN = re.compile(r"^(?:(?P<namespace>[\w.-]+)/)?(?P<name>[\w.-]+?)-v(?P<version>\d+)$")


@dataclass(frozen=True)
class EnvSpec:
    """How to build one env id. `entry_point` is "module:attr" or a callable."""

    id: str
    entry_point: str | Callable[..., Any]
    kwargs: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    #: what the env needs beyond the base install, e.g. ("docker",) or ("extra:alfworld",)
    requires: tuple[str, ...] = ()
    #: the pip extra that provides the env's dependencies, if any
    extra: str | None = None
    #: env kwarg -> wrapper factory ("module:attr" or a callable taking (env, value) and returning
    #: the env, wrapped or, for the kwarg's off value, as it is); applied by `make` in this order
    wrappers: dict[str, str | Callable[..., Any]] = field(default_factory=dict)

    def load_entry_point(self) -> Callable[..., Any]:
        return self._load(self.entry_point)

    def load_wrapper(self, kwarg: str) -> Callable[..., Any]:
        """The wrapper factory that env kwarg `kwarg` switches on."""
        return self._load(self.wrappers[kwarg])

    def _load(self, target: str | Callable[..., Any]) -> Callable[..., Any]:
        if callable(target):
            return target
        module_name, _, attr = target.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if self.extra and not (exc.name or "").startswith("rollhub"):
                raise MissingExtraError(self.extra, f"env {self.id}") from None
            raise
        return getattr(module, attr)


_REGISTRY: dict[str, EnvSpec] = {}
_plugins_loaded = False


def register(
    id: str,
    entry_point: str | Callable[..., Any],
    *,
    description: str = "",
    requires: tuple[str, ...] = (),
    extra: str | None = None,
    wrappers: dict[str, str | Callable[..., Any]] | None = None,
    gymnasium_compat: bool = True,
    **kwargs: Any,
) -> EnvSpec:
    """Register an env id. Re-registering the same id replaces it (with a warning)."""
    if not ID_PATTERN.match(id):
        raise ValueError(f"env id '{id}' must look like 'namespace/Name-vN' (e.g. 'rollhub/Sokoban-v0')")
    if id in _REGISTRY:
        logger.warning("env id %s registered again; replacing", id)
    spec = EnvSpec(
        id=id,
        entry_point=entry_point,
        kwargs=dict(kwargs),
        description=description,
        requires=tuple(requires),
        extra=extra,
        wrappers=dict(wrappers or {}),
    )
    _REGISTRY[id] = spec
    if gymnasium_compat and _gymnasium_installed():
        from rollhub.envs.gym_compat import register_in_gymnasium

        register_in_gymnasium(spec.id, make)
    return spec


def _gymnasium_installed() -> bool:
    """gymnasium is optional at import: rollhub's own envs and trainer never need it (a bare GPU box
    runs without it); `gymnasium.make` works for every id once it is installed."""
    try:
        import gymnasium  # noqa: F401
    except ImportError:
        return False
    return True


def load_plugins() -> None:
    """Import every `rollhub.envs` entry point once."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            target = ep.load()
            if callable(target):
                target()
        except Exception:  # a broken plugin must not take down every env
            logger.exception("could not load env plugin %s (%s)", ep.name, ep.value)


def all_specs() -> list[EnvSpec]:
    load_plugins()
    return sorted(_REGISTRY.values(), key=lambda s: s.id)


#: ids of the form `SOURCE:TARGET` name an env of another standard (rollhub.envs.adapters):
#: source -> (entry point taking the target as its first argument, pip extra, what the target is,
#: sample ids that `rollhub envs list` shows and the performance cards measure)
SOURCES: dict[str, tuple[str, str, str, tuple[str, ...]]] = {
    "gem": (
        "rollhub.envs.adapters.gem:make_gem_env",
        "gem",
        "a GEM id",
        ("gem:game:Sokoban-v0-easy", "gem:rg:basic_arithmetic"),
    ),
    "openenv": (
        "rollhub.envs.adapters.openenv:make_openenv_env",
        "openenv",
        "an OpenEnv Environment class (module:Class) or a server (ws://host:port)",
        ("openenv:rollhub.envs.adapters.samples_openenv:CountdownEnvironment",),
    ),
    "verifiers": (
        "rollhub.envs.adapters.verifiers:make_verifiers_env",
        "verifiers",
        "a module with load_environment() (module or module:function)",
        ("verifiers:rollhub.envs.adapters.samples_verifiers:load_environment",),
    ),
    "harbor": ("rollhub.envs.adapters.harbor:make_harbor_env", "harbor", "a Harbor task directory", ()),
    # your own task as plain Python (rollhub.envs.python_task): no extra needed
    "python": ("rollhub.envs.python_task:PythonFileEnv", "", "a reward or step function (PATH.py:FUNCTION)", ()),
}


def source_of(id: str) -> str:
    """Where an id's env comes from: 'rollhub', a plugin's namespace, or another standard."""
    prefix = id.partition(":")[0] if ":" in id else ""
    if prefix in SOURCES:
        return prefix
    namespace = id.partition("/")[0] if "/" in id else ""
    return "rollhub" if namespace in ("rollhub", "") else f"plugin:{namespace}"


def source_spec(id: str) -> EnvSpec | None:
    """The spec of a `SOURCE:TARGET` id, built on demand; None for other ids."""
    prefix, _, target = id.partition(":")
    if prefix not in SOURCES or not target:
        return None
    entry_point, extra, what, _ = SOURCES[prefix]
    return EnvSpec(
        id=id, entry_point=entry_point, kwargs={"target": target}, description=f"{prefix}: {what}", extra=extra
    )


def spec(id: str) -> EnvSpec:
    load_plugins()
    if id in _REGISTRY:
        return _REGISTRY[id]
    adapted = source_spec(id)
    if adapted is not None:
        return adapted
    close = difflib.get_close_matches(id, list(_REGISTRY), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else "; run 'rollhub envs list' to see all ids"
    raise UserError(f"unknown env id '{id}'{hint}")


def make(id: str, **kwargs: Any) -> Any:
    """Build a registered env; `kwargs` override the registered defaults. Kwargs that name one of
    the id's wrappers go to that wrapper (innermost first, in registration order), the rest to
    the env's constructor."""
    env_spec = spec(id)
    factory = env_spec.load_entry_point()
    arguments = {**env_spec.kwargs, **kwargs}
    wrapper_values = {name: arguments.pop(name) for name in env_spec.wrappers if name in arguments}
    try:
        env = factory(**arguments)
    except TypeError as exc:
        raise UserError(f"bad arguments for env {id}: {exc}") from None
    env.spec = env_spec
    for name, value in wrapper_values.items():
        wrapped = env_spec.load_wrapper(name)(env, value)
        if wrapped is not env:
            wrapped.spec, wrapped.setting = env_spec, name
        env = wrapped
    return env
