"""Env constructor arguments checked against the constructor's signature and type hints.

`rollhub envs try --set KEY=VALUE` and the `env.kwargs` of a train/SFT/eval recipe both go
through `typed_env_kwargs`, so a misspelt name or a wrong type (`dim=banana`) is reported
with the key, the expected type and the allowed names before anything is built: for a run,
before the model loads, not minutes later when the first env starts.
"""

from __future__ import annotations

import difflib
import inspect
import typing
from typing import Any

from rollhub.core.config import coerce_value
from rollhub.core.errors import UserError
from rollhub.envs.registry import EnvSpec


def typed_env_kwargs(env_spec: EnvSpec, kwargs: dict[str, Any], *, key_prefix: str = "") -> dict[str, Any]:
    """`kwargs` checked and coerced (ints widened to float, ...) against `env_spec`'s constructor
    and, for the kwargs that name one of its wrappers, that wrapper's factory.

    `key_prefix` says where the keys came from in messages: "--set " or "env.kwargs.".
    Arguments of a constructor without usable hints (builtins, unresolvable annotations)
    pass unchecked; a constructor with **kwargs accepts any name.
    """
    if not kwargs:
        return dict(kwargs)
    wrapper_hints = {name: _hints(env_spec.load_wrapper(name)) for name in env_spec.wrappers}
    factory = env_spec.load_entry_point()
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # builtins, odd callables
        return dict(kwargs)
    hints = _hints(factory.__init__ if isinstance(factory, type) else factory)
    if hints is None:  # unresolvable annotations: the wrappers' arguments are still typed
        hints = {}
        parameters = {**parameters, "kwargs": inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)}
    open_ended = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    names = [n for n, p in parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and n != "self"]
    names += list(env_spec.wrappers)
    typed = {}
    for key, value in kwargs.items():
        if key in env_spec.wrappers:
            hint = (wrapper_hints[key] or {}).get(key)
        elif key in parameters or open_ended:
            hint = hints.get(key)
        else:
            close = difflib.get_close_matches(key, names, n=2)
            suggestion = f"did you mean {', '.join(close)}? " if close else ""
            raise UserError(
                f"{key_prefix}{key}: {env_spec.id} has no argument '{key}'; {suggestion}arguments: {', '.join(names)}"
            )
        typed[key] = coerce_value(value, hint, f"{key_prefix}{key}") if hint is not None else value
    return typed


def _hints(function: Any) -> dict[str, Any] | None:
    """`function`'s resolved type hints, or None when they cannot be resolved."""
    try:
        return typing.get_type_hints(function)
    except (TypeError, ValueError, NameError):
        return None
