"""The real ALFWorld engine, driven inside one worker process.

Only worker processes import this module: TextWorld's PDDL parsers are module-level objects
that break under threads, so each process plays its games strictly one call at a time.

A `GameSession` is one env slot: a `PddlEnv` wrapped like ALFWorld does it (demangled
names such as `cup 4`), reused across games. `translation_cache` memoises fast-downward's
PDDL-to-SAS translation, which otherwise runs twice on every load and twice more on every
reset (~1.8 s per reset); a group resets the same game G times, so this is most of the
cost of starting an episode.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from collections import OrderedDict
from typing import Any

logger = logging.getLogger(__name__)

#: entries per cache and worker; a worker holds at most a few dozen games in flight (groups share one)
_CACHE_SIZE = 64


def _memoised(max_entries: int) -> tuple[Any, dict[str, int]]:
    """An LRU: `lookup(key, compute)` returns the cached value or stores `compute()`; plus live hit/miss counters."""
    cache: OrderedDict[tuple, Any] = OrderedDict()
    stats = {"hits": 0, "misses": 0}

    def lookup(key: tuple, compute: Any) -> Any:
        if key in cache:
            cache.move_to_end(key)
            stats["hits"] += 1
            return cache[key]
        stats["misses"] += 1
        cache[key] = value = compute()
        if len(cache) > max_entries:
            cache.popitem(last=False)
        return value

    return lookup, stats


def install_translation_cache(max_entries: int = _CACHE_SIZE) -> dict[str, int]:
    """Wrap `fast_downward.pddl2sas` with an LRU keyed by (domain, problem, optimize).

    Returns the live hit/miss counters. The translated task object is only read by
    TextWorld (actions, types, objects, initial facts), so sharing it between sessions is safe;
    the tests replay walkthroughs through the cache to keep that true.
    """
    import fast_downward

    original = getattr(fast_downward.pddl2sas, "__wrapped__", fast_downward.pddl2sas)
    lookup, stats = _memoised(max_entries)

    @functools.wraps(original)
    def cached_pddl2sas(domain: str, problem: str, verbose: bool = False, optimize: bool = False) -> Any:
        return lookup(
            (domain, problem, bool(optimize)), lambda: original(domain, problem, verbose=verbose, optimize=optimize)
        )

    fast_downward.pddl2sas = cached_pddl2sas
    return stats


def install_logic_cache(max_entries: int = _CACHE_SIZE) -> dict[str, int]:
    """Memoise TextWorld's `GameLogic` (the TatSu parse of a game's grammar, ~0.5 s) by text.

    Every member of a group loads the same game into its own engine object; with this they
    share one parsed logic. Sharing is safe: after parsing, TextWorld only reads the logic
    (`derive` deep-copies the rules it expands) and re-adds the domain's types idempotently.
    """
    from textworld.envs.pddl import logic as pddl_logic

    original = getattr(pddl_logic.GameLogic, "__wrapped__", pddl_logic.GameLogic)
    lookup, stats = _memoised(max_entries)

    def cached_game_logic(domain: str, grammar: str) -> Any:
        return lookup((domain, grammar), lambda: original(domain=domain, grammar=grammar))

    cached_game_logic.__wrapped__ = original  # type: ignore[attr-defined]
    pddl_logic.GameLogic = cached_game_logic
    return stats


def ensure_data_env() -> None:
    """Point `ALFWORLD_DATA` at our data before `alfworld.info` is imported.

    Otherwise alfworld creates and adopts `~/.cache/alfworld` on import."""
    import os

    from rollhub.envs.alfworld.games import data_root

    os.environ.setdefault("ALFWORLD_DATA", str(data_root()))


def new_engine_env() -> Any:
    """A fresh `PddlEnv` with ALFWorld's wrappers (demangled names, gamefile info)."""
    ensure_data_env()
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
    from textworld.envs import PddlEnv

    infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])
    return AlfredInfos(AlfredDemangler(PddlEnv(infos)))


def _innermost(env: Any) -> Any:
    while hasattr(env, "_wrapped_env"):
        env = env._wrapped_env
    return env


class GameSession:
    """One env slot: load/reset/step one game at a time, and the state key and expert."""

    def __init__(self) -> None:
        self.env = new_engine_env()
        self.game_path: str | None = None
        self.game_data: dict[str, Any] | None = None
        self.walkthrough: list[str] = []
        #: index of the next walkthrough action while every action so far followed it
        self._walkthrough_pos: int | None = 0
        #: planner output from the current state (consumed as the agent follows it)
        self._plan: list[str] | None = None
        self._admissible: list[str] = []

    # -- engine calls -------------------------------------------------------------------
    def load(self, game_path: str) -> None:
        if game_path == self.game_path:
            return
        with open(game_path) as handle:
            data = json.load(handle)
        self.env.load(game_path)
        self.game_path = game_path
        self.game_data = data
        self.walkthrough = list(data.get("walkthrough") or [])

    def reset(self, game_path: str) -> dict[str, Any]:
        self.load(game_path)
        state = self.env.reset()
        self._walkthrough_pos = 0
        # games without a walkthrough (older files, generated ones) start on the planner
        self._plan = None if self.walkthrough else self.plan()
        return self._reply(state, walkthrough=list(self.walkthrough))

    def step(self, command: str, want_plan: bool) -> dict[str, Any]:
        if self.game_path is None:
            raise RuntimeError("step before reset")
        self._advance_expert(command)
        state, _score, _done = self.env.step(command)
        reply = self._reply(state)
        if want_plan and self._walkthrough_pos is None and self._plan is None and not reply["won"]:
            self._plan = self.plan()
        reply["expert_next"] = self.expert_next()
        return reply

    def plan(self) -> list[str]:
        """Optimal command sequence from the current state (fast-downward)."""
        inner = _innermost(self.env)
        return list(inner._pddl_state.replan(inner._entity_infos))

    # -- expert -------------------------------------------------------------------------
    def _advance_expert(self, command: str) -> None:
        pos = self._walkthrough_pos
        if pos is not None:
            if pos < len(self.walkthrough) and self.walkthrough[pos] == command:
                self._walkthrough_pos = pos + 1
            elif command in self._admissible and not _is_observation_only(command):
                self._walkthrough_pos = None  # off the walkthrough: the planner takes over
        if self._plan is not None:
            if self._plan and self._plan[0] == command:
                self._plan = self._plan[1:]
            elif command in self._admissible and not _is_observation_only(command):
                self._plan = None

    def expert_next(self) -> str | None:
        pos = self._walkthrough_pos
        if pos is not None and pos < len(self.walkthrough):
            return self.walkthrough[pos]
        if self._plan:
            return self._plan[0]
        return None

    # -- observation --------------------------------------------------------------------
    def _reply(self, state: Any, **extra: Any) -> dict[str, Any]:
        self._admissible = list(state["admissible_commands"])
        reply = {
            "feedback": state["feedback"],
            "admissible_commands": self._admissible,
            "won": bool(state["won"]),
            "anchor": self.anchor(),
            "inventory": self.inventory(),
            "expert_next": None,
        }
        reply.update(extra)
        if reply["expert_next"] is None:
            reply["expert_next"] = self.expert_next()
        return reply

    def _facts(self) -> list[Any]:
        return list(_innermost(self.env)._pddl_state.facts)

    def _name(self, entity_id: str) -> str:
        info = _innermost(self.env)._entity_infos.get(entity_id)
        return info.name if info is not None and info.name else entity_id

    def inventory(self) -> list[str]:
        return sorted(self._name(f.arguments[1].name) for f in self._facts() if f.name == "holds")

    def anchor(self) -> str:
        """History-free key of the current state.

        The text of two states can be identical ("Nothing happens.", the same receptacle
        seen before and after heating what you hold), so the key is built from the PDDL
        facts: where the agent is, what it holds, and a digest of every state fact (open
        receptacles, hot/clean/cool objects, object positions), leaving out the facts that
        only record history. Same state, same key, whatever path led there.
        """
        facts = [f for f in self._facts() if _is_state_fact(f.name)]
        location = next((f.arguments[1].name for f in facts if f.name == "atlocation"), "?")
        holding = ",".join(sorted(self._name(f.arguments[1].name) for f in facts if f.name == "holds"))
        digest = hashlib.sha1("\n".join(sorted(map(str, facts))).encode()).hexdigest()[:12]
        return f"at={location};holds={holding or '-'};state={digest}"


#: predicates that record history (what was looked at, where things used to be), not state
_HISTORY_PREDICATES = frozenset({"checked", "examined", "wasinreceptacle"})


def _is_state_fact(name: str) -> bool:
    """TextWorld also keeps the negations of facts an action removed (`not_opened`) and
    fast-downward's derived axioms; neither is part of the state."""
    return not (name.startswith("not_") or name.startswith("new-axiom") or name in _HISTORY_PREDICATES)


def _is_observation_only(command: str) -> bool:
    """Commands that never change the state, so they do not take the expert off track."""
    return command in ("look", "inventory", "help") or command.startswith("examine ")
