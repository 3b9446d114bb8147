"""Mapping rules every adapter shares, so the sources behave alike behind the registry.

* Anchors (GiGPO groups steps by them) must be history-free keys of the state. A source that
  exposes its state (OpenEnv's `state`, GEM's board suffix) anchors on a digest of it, minus
  counters that only grow (`step_count`, `episode_id`); a source that does not anchors on a
  digest of the observation text. The fallback is exact for envs whose observation shows the
  whole state and coarser (it merges states that read alike) for the rest.
* Failures: a source's exception on a model action counts against the action (the rule in
  rollhub.rollout.types), so a policy cannot turn a crash it provokes into an unscored step.
  Only a broken transport (a dead server connection, a timed-out socket) is machinery, raised
  as `ConnectionError`.
* Truncation: sources without a truncation flag are cut at `max_steps` by the adapter
  (`truncated=True`); a source that reports both flags on the last step ended the task by its
  own rules (GEM gives its terminal reward there), so the adapter reports `terminated`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from rollhub.core.errors import MissingExtraError, UserError

#: state keys that count steps or name the episode: they make an anchor history-dependent
COUNTER_KEYS = frozenset({"episode_id", "step_count", "turn", "turn_count", "steps"})


def digest(text: str) -> str:
    """A short stable key of `text` (anchors and task keys)."""
    return hashlib.sha1(text.encode("utf-8", "replace")).hexdigest()[:16]


def state_anchor(state: Any, fallback_text: str) -> str:
    """Anchor of an exposed state (a mapping), without its counters; the text's digest without one."""
    if isinstance(state, dict):
        kept = {k: v for k, v in state.items() if k not in COUNTER_KEYS}
        if kept:
            return "s:" + digest(json.dumps(kept, sort_keys=True, default=str))
    return "o:" + digest(fallback_text)


def require(module: str, extra: str, what: str) -> Any:
    """Import a source's package, or say in one line which extra installs it or that it is broken.

    A package that is present but fails on import (a dependency missing, or installed at a
    version it cannot use: another extra's pins moved it) would otherwise surface as a long
    traceback from deep inside it, which `pip check` may not explain when a package was
    installed without its dependencies; the line names the package, the first line of the
    error and the reinstall that fixes it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] == module.split(".")[0]:
            raise MissingExtraError(extra, what) from None
        raise BrokenExtraError(module, extra, what, exc) from None
    except ImportError as exc:
        raise BrokenExtraError(module, extra, what, exc) from None


class BrokenExtraError(UserError):
    """An optional extra's package is installed but cannot be imported."""

    def __init__(self, module: str, extra: str, what: str, exc: ImportError):
        lines = str(exc).strip().splitlines()
        reason = f"{type(exc).__name__}: {lines[0] if lines else exc.name}"
        super().__init__(
            f"{what}: '{module}' is installed but does not import ({reason}); "
            f"reinstall the extra with its pins: pip install -e '.[{extra}]', then pip check"
        )


def user_message(text: str) -> dict[str, str]:
    return {"role": "user", "content": text if text else "(no output)"}


def split_target(target: str) -> tuple[str, str | None]:
    """'package.module:Attr' -> ('package.module', 'Attr'); 'package.module' -> (..., None)."""
    module, _, attr = target.partition(":")
    return module, attr or None
