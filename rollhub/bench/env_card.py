"""`rollhub bench env ID`: a performance card for any env id, adapters' ids included.

    rollhub bench env gem:game:Sokoban-v0-easy --set episodes=8 --set policy=random

It plays `episodes` seeded episodes with a policy (`random`: the env's `random_action`, or an
unparseable reply when it has none; `expert`: its scripted expert) and writes one JSON card:

* reset and step latency p50 / p99 (seconds, wall time of the awaited call),
* failure rate: episodes that raised or reported `infra_failure`, split by kind,
* memory: the process's RSS after the episodes and its growth since before the env was built,
* containers per episode and container-seconds per episode (Docker containers this process
  started, sampled around every call; 0 without a Docker engine or for envs that need none),
* tokens per episode: the env's messages plus the policy's replies, with the committed tiny
  BPE tokenizer (`--set tokenizer=PATH` for another local one),
* the predicted env-level asynchrony speed-up for this latency distribution: a batch of
  `batch` episodes drawn from the measured ones, stepped in lockstep (every turn waits for the
  batch's slowest env) against each episode at its own pace (the batch waits only for its
  slowest episode), and Prop. 2's bound (rollhub.bench.theory.speedup_bound_from_ratio) with
  the batch's episode-time tail as rho: what overlapping that tail with the rest can give.

Both predictions add `generation_s_per_turn` of model time before every step, which no schedule
removes, so an env whose steps are negligible against generation is predicted ~1x (Amdahl; the
card's `amdahl_bound`, rollhub.bench.async_gain). The default pace is the latency-model engine's
fit of our tiny CPU model (`new_tokens` per turn, `batch` at once), labelled in the card's
`generation_source`; `--set generation_s_per_turn=S` sets your model's pace, and `rollhub bench
async ENV` measures the gain on the real rollout path.

Then the hack battery (rollhub.envs.hack_battery) plays its generic exploits on `hack_seeds`
seeds (default 64, as `check_env`; no new seed after 30 s; 0 skips it), `hack_max_turns` turns at
most per episode (default 8): the card gets `hackability` (the best exploit's mean score), its
scale (`reward`: returns in [0, 1]; `success`: shaped rewards, scored by `info["success"]`), the
best exploit's name, every exploit's score, the seeds played and the env's `hackability_note`.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from rollhub.bench import theory
from rollhub.envs.hack_battery import DEFAULT_MAX_TURNS, HACK_BUDGET_S, HACK_SEEDS


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else 0.0


def _rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class _Containers:
    """Counts this machine's running Docker containers beyond those running at the start."""

    def __init__(self, enabled: bool):
        self.client = None
        if enabled:
            from rollhub.envs.checker import docker_available

            if docker_available():
                import docker

                self.client = docker.from_env(timeout=10)
        self.baseline = self._ids()
        self.seen: set[str] = set()
        self.container_s = 0.0
        self._last = time.perf_counter()

    def _ids(self) -> set[str]:
        return {c.id for c in self.client.containers.list()} if self.client else set()

    def sample(self) -> None:
        now = time.perf_counter()
        if self.client is not None:
            extra = self._ids() - self.baseline
            self.seen |= extra
            self.container_s += len(extra) * (now - self._last)
        self._last = now


def _tokenizer(path: str | None) -> Any:
    if path:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path)
    from rollhub.inference.models import build_tokenizer

    return build_tokenizer()


def predicted_speedups(
    episodes: list[list[float]], batch: int, seed: int = 0, draws: int = 200, generation_s_per_turn: float = 0.0
) -> dict[str, float]:
    """Env-level asynchrony speed-ups for batches drawn from measured episodes (lists of step
    latencies, the reset first) with `generation_s_per_turn` of model time before each step:
    lockstep / own-pace, its Amdahl bound, and Prop. 2's bound with rho from the tail."""
    from rollhub.bench.async_gain import batch_times, predicted_gain

    episodes = [e for e in episodes if e]
    if not episodes:
        return {"lockstep_over_env_async": 1.0, "amdahl_bound": 1.0, "prop2_bound_alpha1": 1.0, "prop2_bound_inf": 1.0}
    gain = predicted_gain(episodes, generation_s_per_turn, batch, seed=seed, draws=draws)
    rng = np.random.default_rng(seed)
    ratios, rhos = [], []
    for _ in range(draws):
        chosen = [episodes[i] for i in rng.integers(len(episodes), size=batch)]
        lockstep, env_async, _ = batch_times(chosen, generation_s_per_turn)
        totals = [e[0] + sum(generation_s_per_turn + x for x in e[1:]) for e in chosen]
        ratios.append(lockstep / env_async if env_async > 0 else 1.0)
        mean = float(np.mean(totals))
        rhos.append(max(totals) / mean if mean > 0 else 0.0)
    rho = float(np.mean(rhos))
    return {
        "lockstep_over_env_async": float(np.mean(ratios)),
        "amdahl_bound": gain["amdahl_bound"],
        "env_share_lockstep": gain["env_share_lockstep"],
        "tail_ratio_rho": rho,
        "prop2_bound_alpha1": theory.speedup_bound_from_ratio(rho, 1.0),
        "prop2_bound_inf": theory.speedup_bound_from_ratio(rho, float("inf")),
    }


async def measure(
    env_id: str,
    *,
    episodes: int = 8,
    seed: int = 0,
    policy: str = "random",
    env_kwargs: dict[str, Any] | None = None,
    batch: int = 32,
    tokenizer: str | None = None,
    generation_s_per_turn: float | None = None,
    new_tokens: int = 32,
    hack_seeds: int = HACK_SEEDS,
    hack_max_turns: int = DEFAULT_MAX_TURNS,
) -> dict[str, Any]:
    """Play the episodes and return the card (see the module docstring). `generation_s_per_turn`:
    the model's time per turn; None = the latency model's tiny CPU fit for `new_tokens` tokens."""
    from rollhub.envs.registry import make, source_of, spec

    env_spec = spec(env_id)
    tok = _tokenizer(tokenizer)
    rss_before = _rss_mb()
    containers = _Containers("docker" in env_spec.requires or source_of(env_id) == "harbor")
    resets: list[float] = []
    steps: list[float] = []
    per_episode: list[list[float]] = []
    tokens: list[int] = []
    lengths: list[int] = []
    model_failures = infra_failures = successes = 0
    rng = np.random.default_rng(seed)
    env = make(env_id, **(env_kwargs or {}))
    try:
        for episode in range(episodes):
            latencies: list[float] = []
            count = 0
            try:
                start = time.perf_counter()
                obs, info = await env.reset(seed=seed + episode)
                latencies.append(time.perf_counter() - start)
                containers.sample()
                resets.append(latencies[-1])
                count += sum(len(tok(m["content"])["input_ids"]) for m in obs)
                if info.get("infra_failure"):
                    infra_failures += 1
                    continue
                for _ in range(env.max_steps):
                    action = _action(env, policy, rng)
                    count += len(tok(action)["input_ids"])
                    start = time.perf_counter()
                    obs, reward, terminated, truncated, info = await env.step(action)
                    latencies.append(time.perf_counter() - start)
                    containers.sample()
                    steps.append(latencies[-1])
                    count += sum(len(tok(m["content"])["input_ids"]) for m in obs)
                    if info.get("infra_failure"):
                        infra_failures += 1
                        break
                    if terminated or truncated:
                        successes += bool(info.get("success"))
                        break
            except (ConnectionError, OSError) as exc:
                infra_failures += 1
                print(f"  episode {episode}: machinery failure {type(exc).__name__}: {exc}")
            except Exception as exc:  # counted against the action, as the rollout counts it
                model_failures += 1
                print(f"  episode {episode}: raised {type(exc).__name__}: {exc}")
            per_episode.append(latencies)
            tokens.append(count)
            lengths.append(len(latencies) - 1)
    finally:
        await env.close()
        containers.sample()
    hack = await _hackability(env_id, env_kwargs, hack_seeds, hack_max_turns, seed) if hack_seeds > 0 else {}
    card = {
        "env": env_id,
        "source": source_of(env_id),
        "policy": policy,
        "episodes": episodes,
        "reset_p50_s": _percentile(resets, 50),
        "reset_p99_s": _percentile(resets, 99),
        "step_p50_s": _percentile(steps, 50),
        "step_p99_s": _percentile(steps, 99),
        "steps_per_episode": float(np.mean(lengths)) if lengths else 0.0,
        "success_rate": successes / episodes,
        "failure_rate": (model_failures + infra_failures) / episodes,
        "model_failures": model_failures,
        "infra_failures": infra_failures,
        "rss_mb": _rss_mb(),
        "rss_growth_mb": _rss_mb() - rss_before,
        "containers_per_episode": len(containers.seen) / episodes,
        "container_s_per_episode": containers.container_s / episodes,
        "tokens_per_episode": float(np.mean(tokens)) if tokens else 0.0,
        "tokenizer": tokenizer or "tiny-bpe",
        "batch": batch,
        **_generation_pace(generation_s_per_turn, batch, new_tokens, tokens, lengths),
    }
    return {
        **card,
        **predicted_speedups(per_episode, batch, seed, generation_s_per_turn=card["generation_s_per_turn"]),
        **hack,
    }


def _generation_pace(
    given_s: float | None, batch: int, new_tokens: int, tokens: list[int], lengths: list[int]
) -> dict[str, Any]:
    """The model time per turn the prediction adds: the given one, or the latency model's fit of the
    tiny CPU model for `batch` requests of `new_tokens` (prefilling each turn's new env tokens)."""
    if given_s is not None:
        return {"generation_s_per_turn": given_s, "generation_source": "given"}
    from rollhub.bench.async_gain import tiny_cpu_generation_s

    turns = sum(length + 1 for length in lengths)
    prompt_tokens = int(sum(tokens) / turns) if turns else 0
    return {
        "generation_s_per_turn": tiny_cpu_generation_s(batch, new_tokens, prompt_tokens),
        "generation_source": f"latency model (fit: HFEngine tiny-5m CPU), {new_tokens} new tokens x {batch}",
    }


async def _hackability(
    env_id: str, env_kwargs: dict[str, Any] | None, seeds: int, max_turns: int, seed: int
) -> dict[str, Any]:
    """The hack battery's card fields, on a fresh env (not counted in the latency figures)."""
    from rollhub.envs.hack_battery import run_battery
    from rollhub.envs.registry import make

    env = make(env_id, **(env_kwargs or {}))
    try:
        result = await run_battery(
            env, seeds=range(seed, seed + seeds), max_turns=max_turns, name=env_id, budget_s=HACK_BUDGET_S
        )
    finally:
        await env.close()
    print(f"  {result.describe()}")
    return {**result.card_fields(), "hackability_note": env.unwrapped.hackability_note}


def _action(env: Any, policy: str, rng: np.random.Generator) -> str:
    from rollhub.envs.checker import GARBAGE_ACTION

    try:
        return env.expert_action() if policy == "expert" else env.random_action(rng)
    except NotImplementedError:
        return GARBAGE_ACTION


def _overrides(items: list[str]) -> dict[str, str]:
    from rollhub.core.errors import UserError

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            options = (
                "episodes, seed, policy, batch, kwargs, tokenizer, generation_s_per_turn, new_tokens, hack_seeds, "
                "hack_max_turns"
            )
            raise UserError(f"--set {item}: expected KEY=VALUE ({options})")
        out[key.strip()] = value
    return out


def run(args: Any) -> dict[str, Any]:
    from rollhub.core.errors import UserError

    env_id = getattr(args, "target", None)
    options = _overrides(args.overrides)
    if not env_id and "table" in options:  # the docs table, one row per card in that folder
        print(write_table(Path(options["table"])))
        return {}
    if not env_id:
        raise UserError("bench env needs an env id: rollhub bench env rollhub/Sokoban-v0")
    episodes = 2 if args.quick else int(options.get("episodes", 8))
    card = asyncio.run(
        measure(
            env_id,
            episodes=episodes,
            seed=int(options.get("seed", 0)),
            policy=options.get("policy", "random"),
            env_kwargs=json.loads(options["kwargs"]) if "kwargs" in options else None,
            batch=int(options.get("batch", 32)),
            tokenizer=options.get("tokenizer"),
            generation_s_per_turn=float(options["generation_s_per_turn"])
            if "generation_s_per_turn" in options
            else None,
            new_tokens=int(options.get("new_tokens", 32)),
            hack_seeds=int(options.get("hack_seeds", HACK_SEEDS)),
            hack_max_turns=int(options.get("hack_max_turns", DEFAULT_MAX_TURNS)),
        )
    )
    out = Path(args.out if args.out != "runs/bench/env" else f"runs/bench/env/{_file_name(env_id)}")
    path = out if out.suffix == ".json" else out / "card.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(card, indent=2) + "\n")
    print(table_row(card, header=True))
    print(f"card: {path}")
    return card


def write_table(folder: Path) -> str:
    """The markdown table of every card (`*.json`) in `folder`, one row each (docs/env_cards.md)."""
    cards = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    if not cards:
        from rollhub.core.errors import UserError

        raise UserError(
            f"no cards (*.json) in {folder}: make them with 'rollhub bench env ID --out {folder}/NAME.json'"
        )
    lines = table_row(cards[0], header=True).splitlines()
    lines += [table_row(card) for card in cards[1:]]
    return "\n".join(lines)


def _file_name(env_id: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in env_id)[:120]


def _hack_cell(card: dict[str, Any]) -> str:
    if "hackability" not in card:
        return "not measured"
    best = f", {card['hackability_best_exploit']}" if card["hackability"] > 0 else ""
    if card["hackability"] > 0 and card.get("hackability_chance") is not None:
        best += f"; random play {card['hackability_chance']:.2f}"
    noted = "; noted" if card.get("hackability_note") else ""
    return f"{card['hackability']:.2f} ({card['hackability_scale']}{best}{noted})"


COLUMNS = (
    ("env", "env"),
    ("source", "source"),
    ("reset p50/p99 ms", lambda c: f"{1e3 * c['reset_p50_s']:.2f} / {1e3 * c['reset_p99_s']:.2f}"),
    ("step p50/p99 ms", lambda c: f"{1e3 * c['step_p50_s']:.2f} / {1e3 * c['step_p99_s']:.2f}"),
    ("fail", lambda c: f"{c['failure_rate']:.2f}"),
    ("RSS MB", lambda c: f"{c['rss_mb']:.0f} (+{c['rss_growth_mb']:.0f})"),
    ("containers/ep", lambda c: f"{c['containers_per_episode']:.1f}"),
    ("container-s/ep", lambda c: f"{c['container_s_per_episode']:.1f}"),
    ("tokens/ep", lambda c: f"{c['tokens_per_episode']:.0f}"),
    ("lockstep/async", lambda c: f"{c['lockstep_over_env_async']:.2f}"),
    ("Amdahl bound", lambda c: f"{c.get('amdahl_bound', float('nan')):.2f}"),
    ("Prop.2 S(1)/S(inf)", lambda c: f"{c['prop2_bound_alpha1']:.2f} / {c['prop2_bound_inf']:.2f}"),
    ("hackability (scale, best exploit)", _hack_cell),
)


def table_row(card: dict[str, Any], header: bool = False) -> str:
    """One markdown table row for the card (with the header lines when asked)."""
    cells = [
        f"`{card[key]}`" if key == "env" else (card[key] if isinstance(key, str) else key(card)) for _, key in COLUMNS
    ]
    row = "| " + " | ".join(str(c) for c in cells) + " |"
    if not header:
        return row
    names = "| " + " | ".join(name for name, _ in COLUMNS) + " |"
    return names + "\n" + "|" + "---|" * len(COLUMNS) + "\n" + row
