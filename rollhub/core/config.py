"""Typed configuration from YAML with `--set a.b=value` overrides.

Configs are plain (nested) dataclasses. `load_config(Cls, path, overrides)` reads YAML,
applies dotted overrides, and builds the dataclass tree, checking every key and type on the
way: an unknown key or a wrong type raises `UserError` naming the dotted key and what is
allowed. Dataclasses may define `validate(self)` for cross-field checks; it runs after
construction (raise `ValueError`, which is re-raised as `UserError` prefixed with the
section's path, "env: ...", unless the message already names its dotted key, "env.max_concurrent
must be >= 1").

Every float must be finite: YAML reads `.nan` and `.inf` (and `nan` as a string) as floats,
and a NaN slips through every range check (`nan < 0` is false) to poison a run hours later.
A field that really means to accept them says so with `field(metadata={ALLOW_NONFINITE: True})`
(none does today).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

import yaml

from rollhub.core.errors import UserError

T = TypeVar("T")

#: dataclass field metadata key: this float field accepts nan and +-inf
ALLOW_NONFINITE = "allow_nonfinite"


class _NonFinite(UserError):
    """A float that is nan or infinite: reported as such, also through `float | None`."""


def parse_override(text: str) -> tuple[list[str], Any]:
    """Parse `a.b.c=value`; the value is read as YAML (so 3, 0.5, true, [1, 2] work)."""
    if "=" not in text:
        raise UserError(f"override '{text}' must look like key.path=value")
    key, raw = text.split("=", 1)
    if not key.strip():
        raise UserError(f"override '{text}' has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.strip().split("."), value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    for item in overrides:
        keys, value = parse_override(item)
        node = data
        for key in keys[:-1]:
            child = node.get(key)
            if child is None:
                child = node[key] = {}
            if not isinstance(child, dict):
                raise UserError(f"override '{item}': '{key}' is not a section")
            node = child
        node[keys[-1]] = value
    return data


def _type_name(tp: Any) -> str:
    if get_origin(tp) is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    return getattr(tp, "__name__", str(tp))


def coerce_value(value: Any, tp: Any, path: str, *, finite: bool = True) -> Any:
    """`value` checked against (and widened to) type `tp`; raises UserError naming `path`.

    `finite=False` lets floats be nan or +-inf (see ALLOW_NONFINITE)."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        options = get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        real = [option for option in options if option is not type(None)]
        if len(real) == 1 and dataclasses.is_dataclass(real[0]) and isinstance(value, dict):
            return coerce_value(value, real[0], path, finite=finite)  # an optional section: its own error
        for option in options:
            if option is type(None):
                continue
            try:
                return coerce_value(value, option, path, finite=finite)
            except _NonFinite:
                raise
            except UserError as exc:
                errors.append(str(exc))
        raise UserError(f"{path}: {value!r} matches none of {' | '.join(_type_name(o) for o in options)}")
    if origin is Literal:
        allowed = get_args(tp)
        if value not in allowed:
            raise UserError(f"{path}: {value!r} is not allowed; choose one of {', '.join(map(repr, allowed))}")
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise UserError(f"{path}: expected a section (mapping) for {tp.__name__}, got {value!r}")
        return build_dataclass(tp, value, path)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise UserError(f"{path}: expected a list, got {value!r}")
        args = get_args(tp)
        item_tp = args[0] if args else Any
        items = [coerce_value(v, item_tp, f"{path}[{i}]", finite=finite) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise UserError(f"{path}: expected a mapping, got {value!r}")
        _, val_tp = get_args(tp) or (Any, Any)
        return {k: coerce_value(v, val_tp, f"{path}.{k}", finite=finite) for k, v in value.items()}
    if tp is float:
        return _coerce_float(value, path, finite=finite)
    if tp is Path and isinstance(value, str):
        return Path(value)
    if isinstance(tp, type):
        if tp is int and isinstance(value, bool):
            raise UserError(f"{path}: expected int, got {value!r}")
        if isinstance(value, tp):
            return value
        raise UserError(f"{path}: expected {_type_name(tp)}, got {type(value).__name__} {value!r}")
    return value


def _coerce_float(value: Any, path: str, *, finite: bool) -> float:
    """A float from a float, an int (widened) or a numeric string (YAML 1.1 reads 1e-3 as one)."""
    number: float | None = None
    if isinstance(value, float):
        number = value
    elif isinstance(value, int) and not isinstance(value, bool):
        number = float(value) if abs(value) < 2**1023 else math.inf
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            pass
    if number is None:
        raise UserError(f"{path}: expected float, got {type(value).__name__} {value!r}")
    if finite and not math.isfinite(number):
        raise _NonFinite(f"{path}: {value!r} is not a finite number (nan and infinity are not allowed here)")
    return number


def _qualify(path: str, message: str) -> str:
    """A validate() message with its section in front, unless it already starts with its dotted key."""
    if not path or message.startswith(f"{path}."):
        return message
    return f"{path}: {message}"


def build_dataclass(cls: type[T], data: dict, path: str = "") -> T:
    """Build `cls` from a mapping, rejecting unknown keys and wrong types."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [k for k in data if k not in fields]
    moved: dict[str, str] = getattr(cls, "MOVED_KEYS", {})  # retired names and where their setting lives now
    for key in unknown:
        if key in moved:
            where = f"{path}.{key}" if path else str(key)
            raise UserError(f"config key '{where}' is gone: use {moved[key]}")
    if unknown:
        key = unknown[0]
        close = difflib.get_close_matches(str(key), fields, n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        where = f"{path}.{key}" if path else str(key)
        raise UserError(f"unknown config key '{where}'{hint}; allowed keys: {', '.join(sorted(fields))}")
    kwargs = {}
    for name, value in data.items():
        finite = not fields[name].metadata.get(ALLOW_NONFINITE, False)
        kwargs[name] = coerce_value(value, hints[name], f"{path}.{name}" if path else name, finite=finite)
    try:
        obj = cls(**kwargs)
    except TypeError as exc:
        raise UserError(f"{path or cls.__name__}: {exc}") from None
    validate = getattr(obj, "validate", None)
    if callable(validate):
        try:
            validate()
        except ValueError as exc:
            raise UserError(_qualify(path, str(exc))) from None
    return obj


class _UniqueKeyLoader(yaml.SafeLoader):
    """A YAML loader that refuses a key given twice in one mapping: plain YAML keeps the last
    one silently, so a second `env:` block would drop the first one's settings unseen."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} is given twice in one mapping", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None) -> T:
    """Read YAML at `path` (or start empty), apply overrides, and build `cls`."""
    data: dict = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise UserError(f"config file not found: {path}")
        try:
            data = yaml.load(path.read_text(), Loader=_UniqueKeyLoader) or {}
        except yaml.YAMLError as exc:
            raise UserError(f"{path} is not valid YAML: {' '.join(str(exc).split())}") from None
        if not isinstance(data, dict):
            raise UserError(f"{path}: the top level must be a mapping")
    data = apply_overrides(data, overrides or [])
    return build_dataclass(cls, data)


def config_to_dict(obj: Any) -> Any:
    """Plain dict of a config (for logging and checkpoints)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: config_to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [config_to_dict(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj
