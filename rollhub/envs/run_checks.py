"""Checks of a run's envs before any model loads, from env ids and kwargs alone.

A wrong kwarg, a value the constructor refuses, an evaluation env that reuses training
tasks: each is a one-line `UserError` naming the config key, raised before minutes of
model loading and SFT are spent. The trainer's composition root calls `check_run_envs`.
"""

from __future__ import annotations

import asyncio
import difflib
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rollhub.core.errors import UserError
from rollhub.envs.base import Env

#: evaluation seeds whose tasks the overlap check reads (the first ones: evaluation plays them first)
EVAL_KEY_SAMPLE = 1000
#: training seeds whose tasks it reads when the training env cannot answer `could_draw`: enough to
#: cover a small space (difficulty-1 arithmetic has 800 problems)
TRAIN_KEY_SAMPLE = 5000
#: wall time the reading may take, for the evaluation and the training seeds each
KEY_SAMPLE_BUDGET_S = 5.0


def check_env_registered(env_id: str) -> None:
    """Fail before any model loads when the env id is unknown."""
    from rollhub.envs.registry import all_specs, source_spec

    ids = [spec.id for spec in all_specs()]
    if env_id not in ids and source_spec(env_id) is None:  # `gem:...`-style ids are built on demand
        close = difflib.get_close_matches(env_id, ids, n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise UserError(f"env id '{env_id}' is not registered{hint}; see 'rollhub envs list'")


def check_env_kwargs(env_id: str, kwargs: dict[str, Any], *, where: str = "env.kwargs") -> dict[str, Any]:
    """An env's kwargs checked against its constructor (names and types), before any model loads.

    Returns them typed (an int given for a float argument widened, `1e-3` read as a number),
    so the run builds its envs from exactly what was checked. A wrong key or type raises
    UserError naming `{where}.KEY`; an env whose extra is not installed raises the
    MissingExtraError that building it would.
    """
    from rollhub.envs.arguments import typed_env_kwargs
    from rollhub.envs.registry import spec

    check_env_registered(env_id)
    return typed_env_kwargs(spec(env_id), kwargs, key_prefix=f"{where}.")


def check_run_envs(
    train_id: str,
    train_kwargs: dict[str, Any],
    eval_id: str,
    eval_kwargs: dict[str, Any],
    *,
    demo_kwargs: dict[str, Any] | None = None,
    eval_seeds: Sequence[int] | None = None,
    train_seeds: Sequence[int] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A run's envs checked before any model loads: both envs' kwargs typed and checked, the
    demonstration envs' overrides (`demo_kwargs`, over the training kwargs) too, and evaluation
    proven disjoint from training. Returns (training kwargs, evaluation kwargs) as typed, so the
    run builds exactly what was checked. `eval_seeds` and `train_seeds` let the overlap check read
    the content of procedural tasks (`Env.task_key`).
    """
    train_kwargs = check_env_kwargs(train_id, train_kwargs)
    if demo_kwargs:  # the demonstration envs' arguments, typed and checked the same way
        check_env_kwargs(train_id, {**train_kwargs, **demo_kwargs})
    eval_kwargs = check_env_kwargs(eval_id, eval_kwargs, where="eval.env.kwargs")
    check_env_values(train_id, train_kwargs, "env.kwargs")
    if demo_kwargs:
        check_env_values(train_id, {**train_kwargs, **demo_kwargs}, "sft.env_kwargs")
    check_env_values(eval_id, eval_kwargs, "eval.env.kwargs", evaluation=True)
    check_eval_disjoint(train_id, train_kwargs, eval_id, eval_kwargs, eval_seeds=eval_seeds, train_seeds=train_seeds)
    return train_kwargs, eval_kwargs


def check_env_values(env_id: str, kwargs: dict[str, Any], where: str, *, evaluation: bool = False) -> None:
    """Values the constructor or a wrapper refuses, as a one-line UserError before any model loads.

    Only for env classes that say construction is cheap (`CHECK_BY_BUILDING`); others are
    built where the run needs them. For the eval env, also refuses a training-only wrapper
    (rollhub.envs.wrappers): a difficulty floor or a curriculum would read a distribution other
    than the env's own, an altered number that nobody would see as an error.
    """
    from rollhub.envs.registry import make, spec

    env_spec = spec(env_id)
    env_class = _env_class(env_id)
    wraps = evaluation and any(name in kwargs for name in env_spec.wrappers)
    if not (wraps or (env_class is not None and env_class.CHECK_BY_BUILDING)):
        return
    try:
        env = make(env_id, **kwargs)
    except ValueError as error:
        raise UserError(f"{where}: {error}") from None
    if evaluation:
        from rollhub.envs.wrappers import wrappers_of

        for wrapper in wrappers_of(env):
            if wrapper.training_only:
                key = wrapper.setting or type(wrapper).__name__
                raise UserError(
                    f"{where}.{key} is {kwargs.get(key)!r}: it wraps {env_id} in {type(wrapper).__name__}, a "
                    f"training-only lever, so evaluation would read another distribution than the env's own; "
                    f"switch it off for evaluation (eval.env.kwargs: {{{key}: 0}})"
                )


def _env_class(env_id: str) -> type[Env] | None:
    """The env's class when its entry point is one (a factory function says nothing up front)."""
    from rollhub.envs.registry import spec

    factory = spec(env_id).load_entry_point()
    return factory if isinstance(factory, type) and issubclass(factory, Env) else None


def env_task_set(env_id: str, kwargs: dict[str, Any]) -> dict[str, str] | None:
    """The tasks an env draws from (identity key -> readable name), or None for a procedural env.

    Envs with a fixed task list (ALFWorld games, SWE tasks) override `Env.task_set`; an env
    without one makes tasks from seeds, and its overlap is read by content (`env_task_keys`) or
    left to the run config's seed ranges. The env is built only when its class overrides the method, which
    the contract asks to be cheap (no worker, no container): this costs a file listing.
    """
    from rollhub.envs.registry import make

    env_class = _env_class(env_id)
    if env_class is None or env_class.task_set is Env.task_set:
        return None
    return make(env_id, **kwargs).task_set()


def env_could_draw(env_id: str, kwargs: dict[str, Any], tasks: dict[str, str]) -> dict[str, str] | None:
    """The entries of `tasks` a procedural env might ever play, or None when it cannot tell.

    An env without a task list answers through `Env.could_draw` (Math-v0's train split never
    draws its test partition, which it decides by content), so evaluating on a fixed list is
    checked against training even though training draws from seeds.
    """
    from rollhub.envs.registry import make

    env_class = _env_class(env_id)
    if env_class is None or env_class.could_draw is Env.could_draw:
        return None
    drawable = make(env_id, **kwargs).could_draw(set(tasks))
    return None if drawable is None else {key: tasks[key] for key in drawable}


def _overrides(env_id: str, member: str) -> bool:
    env_class = _env_class(env_id)
    return env_class is not None and getattr(env_class, member) is not getattr(Env, member)


def env_task_keys(
    env_id: str, kwargs: dict[str, Any], seeds: Sequence[int], *, budget_s: float
) -> dict[str, str] | None:
    """Content key -> `seed N 'task'` of the tasks the env draws on `seeds` (read in order until
    `budget_s` runs out), or None when the env reports no content (`Env.task_key`).

    The env is built with `make`, wrappers included, so training is read as it draws. Resets run
    on an event loop of their own in a worker thread: the run's loop is already running here.
    """
    if not seeds or not _overrides(env_id, "task_key"):
        return None
    from rollhub.envs.registry import make

    async def read() -> dict[str, str]:
        env = make(env_id, **kwargs)
        keys: dict[str, str] = {}
        deadline = time.perf_counter() + budget_s
        try:
            for seed in seeds:
                await env.reset(seed=seed)
                key = env.task_key()
                if key is not None and key not in keys:
                    shown = next((line.strip() for line in env.render_text().splitlines() if line.strip()), "")
                    keys[key] = f"seed {seed}" + (f" '{shown[:60]}'" if shown else "")
                if time.perf_counter() > deadline:
                    break
        finally:
            await env.close()
        return keys

    with ThreadPoolExecutor(max_workers=1) as pool:
        try:
            keys = pool.submit(asyncio.run, read()).result()
        except ValueError as error:
            raise UserError(f"{env_id}: {error}") from None
    return keys or None


def check_eval_disjoint(
    train_id: str,
    train_kwargs: dict[str, Any],
    eval_id: str,
    eval_kwargs: dict[str, Any],
    *,
    eval_seeds: Sequence[int] | None = None,
    train_seeds: Sequence[int] | None = None,
    names: tuple[str, str] = ("evaluation", "training"),
    fix: str = (
        "point eval.env.kwargs at a held-out split (ALFWorld split: valid_unseen, SWE split: eval, Math split: test) "
        "or change env.kwargs"
    ),
) -> None:
    """Refuse a run whose evaluation tasks include training tasks (one-line UserError), by content.

    Training here means the training env, which also serves the SFT demonstrations. The evaluation
    tasks are the eval env's `task_set`, else the content keys (`Env.task_key`) of the tasks it
    draws on its first `eval_seeds`: disjoint seed ranges say nothing in a finite procedural space
    (difficulty-1 arithmetic has 800 problems, so most of 200 evaluation seeds' problems are also
    drawn in training). Training answers with its own `task_set`, else `could_draw` (Math-v0's
    train split decides by a hash of the problem text, so it proves it never draws a key), else
    the keys of the tasks it draws on its first `train_seeds`, a sample that finds the overlap of
    a small space. An env with neither a list nor content keys is left to the seed-range check
    of the run config. `names` (the eval side's, the training side's) and `fix` word the error for
    another pair of task sets (checkpoint selection's validation tasks against training, or the
    held-out tasks against validation).
    """
    train = env_task_set(train_id, train_kwargs)
    held_out = env_task_set(eval_id, eval_kwargs)
    sampled = held_out is None
    if sampled and eval_seeds is not None:
        held_out = env_task_keys(eval_id, eval_kwargs, eval_seeds[:EVAL_KEY_SAMPLE], budget_s=KEY_SAMPLE_BUDGET_S)
    if held_out is None:
        return
    drawn_by = ""
    if train is None:  # a procedural training env: what it could draw, else what it draws
        train = env_could_draw(train_id, train_kwargs, held_out)
    if train is None and train_seeds is not None:
        train = env_task_keys(train_id, train_kwargs, train_seeds[:TRAIN_KEY_SAMPLE], budget_s=KEY_SAMPLE_BUDGET_S)
        drawn_by = f" (found among the tasks of its first {names[1]} seeds)"
    if train is None:
        return
    shared = [key for key in held_out if key in train]
    if shared:
        examples = ", ".join(held_out[key] for key in shared[:3])
        entries = (
            f"distinct tasks that the first {names[0]} seeds draw from {eval_id}"
            if sampled
            else f"{names[0]} entries (games, tasks or packages) of {eval_id}"
        )
        raise UserError(
            f"{names[0]} overlaps {names[1]}: {len(shared)} of the {len(held_out)} {entries} are also in "
            f"{names[1]}{drawn_by} (e.g. {examples}); {fix}"
        )
