"""mini-swe-agent, unmodified, as a rollhub agent program on the SWE tasks (README.md beside this file).

Run by `rollhub train ... --set 'agent.program=[python, examples/mini_swe_agent/agent.py, ...]'`
(or `command_program`), once per episode, with the gateway session in its environment:
OPENAI_BASE_URL (the session's OpenAI URL), ROLLHUB_GATEWAY_URL, ROLLHUB_SESSION_ID, ROLLHUB_SEED.
mini-swe-agent's own `DefaultAgent`, prompts (its `mini_textbased.yaml`) and litellm model class
talk to the session; its commands run in the task's container (rollhub.envs.swe.agent.mini_swe_agent);
the diff is graded as `rollhub/SWE-v0` grades a submit, and the reward goes to the session.

Exit status: 0 when the episode was scored (the reward, 0 or 1, was reported); 3 on an infra
failure (nothing reported: the gateway marks the session's trajectories infra-failed, never
trained on); 2 for a usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

# before mini-swe-agent and litellm are imported: no banner, no cost-map download (offline machines),
# few retries (a 400 from the gateway is not worth minutes of backoff)
os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
os.environ.setdefault("MSWEA_COST_TRACKING", "ignore_errors")
os.environ.setdefault("MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT", "2")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

EXIT_INFRA = 3
logger = logging.getLogger("mini_swe_agent_program")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default=None, help="task file (default: rollhub's shipped SWE tasks)")
    parser.add_argument("--split", default="test", help="train / eval (packages of data/splits.json) or test (all)")
    parser.add_argument("--instance-id", default=None, help="play this task whatever the seed")
    parser.add_argument("--config", default="mini_textbased", help="mini-swe-agent config (name or YAML path)")
    parser.add_argument("--step-limit", type=int, default=30, help="model calls per episode (SWEEnv's max_steps)")
    parser.add_argument("--wall-time-s", type=int, default=540, help="stop the agent after this long (0: never)")
    parser.add_argument("--max-tokens", type=int, default=None, help="per reply (default: the gateway's)")
    parser.add_argument("--model-name", default=os.environ.get("ROLLHUB_MODEL_NAME", "rollhub-policy"))
    parser.add_argument("--command-timeout-s", type=float, default=60.0)
    parser.add_argument("--grade-on-limit", action="store_true", help="grade the diff of a run that did not submit")
    parser.add_argument("--result", type=Path, default=None, help="append the episode's JSON summary here")
    parser.add_argument("--trajectory", type=Path, default=None, help="save mini-swe-agent's own trajectory here")
    args = parser.parse_args(argv)
    if args.step_limit < 1 or args.wall_time_s < 0 or args.command_timeout_s <= 0:
        parser.error("--step-limit must be >= 1, --wall-time-s >= 0 and --command-timeout-s > 0")
    for name in ("OPENAI_BASE_URL", "ROLLHUB_GATEWAY_URL", "ROLLHUB_SESSION_ID"):
        if not os.environ.get(name):
            parser.error(f"{name} is not set: run this under a gateway session (docs/gateway.md, 'agent.program')")
    return args


def build_agent(args: argparse.Namespace, environment: Any) -> Any:
    """mini-swe-agent's DefaultAgent with its text-based litellm model on the session's URL."""
    import litellm
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.config import get_config_from_spec
    from minisweagent.models.litellm_textbased_model import LitellmTextbasedModel

    config = get_config_from_spec(args.config)
    model_config = dict(config.get("model", {}))
    model_kwargs = {
        **model_config.pop("model_kwargs", {}),
        "api_base": os.environ["OPENAI_BASE_URL"],
        "api_key": os.environ.get("OPENAI_API_KEY", "rollhub"),
        "drop_params": True,
    }
    if args.max_tokens:
        model_kwargs["max_tokens"] = args.max_tokens
    model_config.pop("model_class", None)
    model = LitellmTextbasedModel(
        **{**model_config, "model_name": f"openai/{args.model_name}", "model_kwargs": model_kwargs}
    )
    agent_config = {
        **config.get("agent", {}),
        "step_limit": args.step_limit,
        "wall_time_limit_seconds": args.wall_time_s,
        "cost_limit": 0.0,  # the gateway reports no cost
        "output_path": args.trajectory,
    }
    # a 400 (context overflow, a bad field) is final: no backoff (429s and connection errors still retry)
    model.abort_exceptions = [*model.abort_exceptions, litellm.exceptions.BadRequestError]
    return DefaultAgent(model, environment, **agent_config)


async def play(args: argparse.Namespace) -> Any:
    from rollhub.envs.swe.agent.mini_swe_agent import run_episode
    from rollhub.envs.swe.env import SWEEnv
    from rollhub.sandbox.docker_backend import DockerBackend
    from rollhub.sandbox.pool import SandboxPool

    session = os.environ["ROLLHUB_SESSION_ID"]
    backend = DockerBackend(labels={"rollhub.gateway.session": session[:60]})
    pool = SandboxPool(backend, max_concurrent=1)
    swe = SWEEnv(
        args.tasks,
        split=args.split,
        command_timeout_s=args.command_timeout_s,
        grade_on_truncation=args.grade_on_limit,
        backend=backend,
    )
    seed_text = os.environ.get("ROLLHUB_SEED", "")
    seed = int(seed_text) if seed_text.strip() else None
    task = swe.pick_task(seed, {"instance_id": args.instance_id} if args.instance_id else None)
    mini_config = _mini_config(args.config)
    try:
        return await run_episode(
            swe,
            task,
            lambda environment: build_agent(args, environment),
            pool=pool,
            environment_env=mini_config.get("environment", {}).get("env", {}),
            model_ended=context_overflow,
        )
    finally:
        await pool.close()
        await backend.close()


def context_overflow(exc: Exception) -> str:
    """The conversation outgrew the context: the model's doing (reward 0), as a step limit is. The
    gateway answers 400 with OpenAI's code `context_length_exceeded`, which litellm passes through."""
    import litellm

    overflow = isinstance(exc, litellm.exceptions.ContextWindowExceededError)
    return "ContextWindowExceeded" if overflow or getattr(exc, "code", None) == "context_length_exceeded" else ""


def _mini_config(spec: str) -> dict[str, Any]:
    from minisweagent.config import get_config_from_spec

    return get_config_from_spec(spec)


def report_reward(reward: float, success: bool) -> None:
    import httpx

    url = f"{os.environ['ROLLHUB_GATEWAY_URL']}/sessions/{os.environ['ROLLHUB_SESSION_ID']}/reward"
    httpx.post(url, json={"reward": reward, "success": success}, timeout=60).raise_for_status()


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    # the gateway ends a program past its time with SIGTERM before SIGKILL: unwind, so the container is removed
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        result = asyncio.run(play(args))
    except Exception as exc:  # the model API or the machinery failed: no score, one line for the gateway's log
        print(f"infra failure: {type(exc).__name__}: {str(exc)[:300]}", file=sys.stderr)
        return EXIT_INFRA
    summary = result.summary()
    if args.result is not None:
        with args.result.open("a") as out:
            out.write(json.dumps(summary) + "\n")
    print(json.dumps(summary))
    if result.infra_failed:
        print(f"infra failure on {result.instance_id}: {result.reason}", file=sys.stderr)
        return EXIT_INFRA
    report_reward(result.reward, result.success)
    return 0


if __name__ == "__main__":
    sys.exit(main())
