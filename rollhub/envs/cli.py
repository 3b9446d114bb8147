"""`rollhub envs list` and `rollhub envs try ID`.

`try` plays one episode and prints the transcript: the env's messages, each action and its
reward. Every env can be tried: the default agent, `random`, is the env's own random agent or,
for an env without one (the README's ten-line example, most adapted envs), actions shaped like
the examples its messages show (rollhub.envs.players). An env that raises is one line naming
it and the exception (rollhub.envs.episode). With `--json` the last line is exactly one JSON object
`{"env", "seed", "steps", "return", "success"}` so scripts can read the outcome.
Kept import-light: numpy and the env modules load inside the handlers.

`--agent model` plays a model, which this layer cannot load (envs sit below rollhub.inference):
rollhub.rollout.cli, the layer above, gives the `try` parser its opener of chat models as the
`open_chat_model` default.
"""

from __future__ import annotations

import argparse
import json

from rollhub.core.errors import UserError

#: random: the env's own random agent, or actions shaped like the examples its messages show (any env);
#: expert: the env's scripted expert; human: you, at the terminal; model: --model PATH_OR_URL
AGENTS = ("random", "expert", "human", "model")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("envs", help="list and try environments")
    commands = parser.add_subparsers(dest="envs_command", metavar="{list,try}", parser_class=type(parser))
    parser.set_defaults(func=_missing_command)

    listing = commands.add_parser("list", help="registered env ids, what each needs")
    listing.add_argument("--json", action="store_true", help="one JSON object per env")
    listing.set_defaults(func=list_envs)

    trying = commands.add_parser("try", help="play one episode and print the transcript")
    trying.add_argument("env_id", metavar="ID", help="env id, e.g. rollhub/Sokoban-v0")
    trying.add_argument("--seed", type=int, default=0, help="episode seed (default 0)")
    trying.add_argument(
        "--agent", choices=AGENTS, default="random", help="who plays (default random: works for every env)"
    )
    trying.add_argument(
        "--model",
        default=None,
        metavar="PATH_OR_URL",
        help="for --agent model: a checkpoint folder (played on the CPU) or an OpenAI-compatible URL",
    )
    trying.add_argument("--model-name", default=None, help="the endpoint's model name (default: its first)")
    trying.add_argument("--temperature", type=float, default=0.0, help="--agent model sampling (default 0: greedy)")
    trying.add_argument("--max-new-tokens", type=int, default=256, help="--agent model: most tokens per reply")
    trying.add_argument("--json", action="store_true", help="end with one JSON line: env, seed, steps, return, success")
    trying.add_argument("--max-steps", type=int, default=None, help="stop after N steps (default: the env's limit)")
    trying.add_argument(
        "--set",
        dest="env_args",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="env constructor argument, e.g. --set num_boxes=2",
    )
    trying.set_defaults(func=try_env)


def _missing_command(args: argparse.Namespace) -> int:
    raise UserError("envs needs a command: 'rollhub envs list' or 'rollhub envs try ID'")


def list_envs(args: argparse.Namespace) -> int:
    from rollhub.envs.checker import missing_requirements
    from rollhub.envs.registry import SOURCES, all_specs, source_of, source_spec

    specs = all_specs() + [source_spec(sample) for entry in SOURCES.values() for sample in entry[3]]
    rows = []
    for spec in specs:
        needs = list(spec.requires) + (
            [f"extra:{spec.extra}"] if spec.extra and f"extra:{spec.extra}" not in spec.requires else []
        )
        missing = missing_requirements(spec) if needs else []
        rows.append(
            {
                "id": spec.id,
                "source": source_of(spec.id),
                "description": spec.description,
                "needs": needs,
                "available": not missing,
            }
        )
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    width = max([len(r["id"]) for r in rows] + [2])
    print(f"{'ID':{width}}  {'SOURCE':12}  {'NEEDS':24}  DESCRIPTION")
    for row in rows:
        needs = ", ".join(row["needs"]) or "-"
        if not row["available"]:
            needs += " (missing)"
        print(f"{row['id']:{width}}  {row['source']:12}  {needs:24}  {row['description']}")
    forms = "; ".join(f"{name}:<{entry[2]}>" for name, entry in SOURCES.items())
    print(f"(any env of another standard: {forms})")
    return 0


def parse_env_args(items: list[str]) -> dict:
    from rollhub.core.config import parse_override

    kwargs = {}
    for item in items:
        keys, value = parse_override(item)
        if len(keys) != 1:
            raise UserError(f"--set {item}: env arguments are flat (KEY=VALUE), not dotted paths")
        kwargs[keys[0]] = value
    return kwargs


def try_env(args: argparse.Namespace) -> int:
    import asyncio

    from rollhub.envs.arguments import typed_env_kwargs
    from rollhub.envs.checker import missing_requirements
    from rollhub.envs.registry import make, spec

    if args.max_steps is not None and args.max_steps < 1:
        raise UserError(f"--max-steps must be >= 1, got {args.max_steps}")
    if args.seed < 0:
        raise UserError(f"--seed must be >= 0, got {args.seed}")
    if (args.agent == "model") != (args.model is not None):
        raise UserError(
            "--agent model plays the model of --model PATH_OR_URL (a checkpoint folder or an OpenAI-compatible URL)"
            if args.agent == "model"
            else f"--model is for --agent model (got --agent {args.agent})"
        )
    env_spec = spec(args.env_id)
    missing = missing_requirements(env_spec)
    if missing:
        raise UserError(f"{args.env_id} cannot run here: {'; '.join(missing)}")
    kwargs = typed_env_kwargs(env_spec, parse_env_args(args.env_args), key_prefix="--set ")
    try:
        env = make(args.env_id, **kwargs)
    except ValueError as exc:
        raise UserError(f"bad arguments for env {args.env_id}: {exc}") from None
    return asyncio.run(_play(env, args))


async def _play(env, args: argparse.Namespace) -> int:
    from rollhub.envs.episode import play_episode

    model = None
    if args.agent == "model":
        open_chat_model = getattr(args, "open_chat_model", None)  # set by rollhub.rollout.cli
        if open_chat_model is None:
            raise UserError("--agent model needs rollhub's rollout layer, which this command line was built without")
        model = open_chat_model(
            args.model, model_name=args.model_name, temperature=args.temperature, max_new_tokens=args.max_new_tokens
        )
    try:
        player = _player(args.agent, args.seed, model)
        outcome = await play_episode(
            env, player, env_id=args.env_id, seed=args.seed, max_steps=args.max_steps, show=_show
        )
    finally:
        await env.close()
        if model is not None:
            await model.close()
    if args.json:
        print(
            json.dumps(
                {
                    "env": args.env_id,
                    "seed": args.seed,
                    "steps": outcome.steps,
                    "return": round(outcome.total_reward, 6),
                    "success": outcome.success,
                }
            )
        )
    else:
        print(f"episode: {outcome.steps} steps, return {outcome.total_reward:+.2f}, success {outcome.success}")
    return 0


def _player(agent: str, seed: int, model):
    """The `--agent` as a player of rollhub.envs.episode: (env, conversation) -> action or None."""
    import numpy as np

    from rollhub.envs.players import action_or_example

    rng = np.random.default_rng(seed)

    async def play(env, conversation):
        if agent == "random":  # the env's own random agent, else actions shaped like its examples
            return action_or_example(env, conversation, rng)
        if agent == "expert":
            try:
                return env.expert_action()
            except NotImplementedError:
                raise UserError(
                    f"{type(env).__name__} has no scripted expert; use --agent random (plays any env), human or model"
                ) from None
        if agent == "model":
            return await model.reply(conversation, env.tools if env.chat_template_tools else None)
        return _human_action(env)

    return play


def _human_action(env) -> str | None:
    from rollhub.envs.base import wrap_action

    try:
        text = input(f"your action (plain text is wrapped in <{env.action_tag}>; Ctrl-D stops)> ")
    except EOFError:
        print()
        return None
    return text if f"<{env.action_tag}>" in text else wrap_action(text.strip(), env.action_tag)


def _show(kind: str, value) -> None:
    if kind == "messages":
        for message in value:
            print(f"[{message['role']}]")
            print(message["content"])
    elif kind == "action":
        print(f"[agent] {value}")
    elif kind == "step":
        reward, total, terminated, truncated = value
        print(
            f"[reward {reward:+.2f}  return {total:+.2f}"
            f"{'  terminated' if terminated else ''}{'  truncated' if truncated else ''}]"
        )
