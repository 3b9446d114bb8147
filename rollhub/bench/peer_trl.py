"""`rollhub bench peer-trl`: TRL's GRPOTrainer beside our trainer, synchronous and asynchronous,
on the same model, task, batch, learning rate, token budget and step budget, in one process.

Why interleaved in one process: on a shared machine the load moves over minutes. The legs
(TRL, ours sync, ours async) alternate round after round, the order rotating each round, so a
slow spell lands on all three and the ratios of seconds per step stay fair even when the
absolute numbers move with the load.

Held equal: the model folder the legs start from; the task (the recipe's env, the same training
problems in the same order: TRL's dataset is our rollout's first seeds, unshuffled); prompts x
group per step; max new tokens; sampling temperature and top-p; a constant learning rate with
AdamW's settings and gradient clipping; the GRPO algorithm where both have the knob (group-std
normalised advantages, PPO clip `clip` both sides, no KL, one update per batch, TRL's loss
aggregation `loss_type` mapped to ours, no importance correction); gradient checkpointing (off
for both unless `gradient_checkpointing=true`; TRL's own default is on); the torch threads of
each piece of work (`threads`: TRL's loop; ours sync, its engine and its trainer, which take
turns; ours async, the same two at once: generating on the core an update leaves idle is what
asynchrony buys).
Not held equal, and the point of the comparison: how each generates (TRL: `model.generate` in
its training loop; ours: its engine, in-process or the recipe's server) and whether generation
overlaps the update.

Both sides read held-out success through one evaluator (`evaluate_held_out`: the recipe's
held-out problems, greedy), at the start, every `eval_every` steps and at the end, on a clock
of training time that leaves the readings out. Seconds per step are steady-state: the first
step of a leg and a step right after a reading are left out (the first holds warm-up, and
asynchronous generation keeps going during a reading).

Models: `tiny` (a random-init tiny Qwen3 built in the output folder: mechanics and speed, it
learns nothing in a few steps) or `smollm2` (the math recipe's SmolLM2-135M-Instruct, exported
locally). Choose it as the target (`rollhub bench peer-trl smollm2`) or `--set model=smollm2`.
Options (`--set key=value`): the fields of PeerTrlConfig.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import shutil
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rollhub.bench.peer_trl_legs import TRL_LOSS_AGGREGATION, run_ours, run_trl
from rollhub.bench.report import print_table, save_json, save_plot
from rollhub.core.config import load_config
from rollhub.core.errors import MissingExtraError, UserError

logger = logging.getLogger(__name__)

MODELS = ("tiny", "smollm2")
TRAINERS = ("trl", "sync", "async")


@dataclass
class PeerTrlConfig:
    model: str = "tiny"  # tiny: a random-init tiny Qwen3 (speed, mechanics); smollm2: the recipe's model
    recipe: str = "configs/math_smollm2.yaml"  # task (env, held-out split), agent and engine come from it
    tiny_size: str = "5m"  # size of the tiny model (rollhub.inference.models.TINY_SIZES)
    prompts: int = 2  # prompts (groups) per step
    group: int = 8  # completions per prompt
    max_new_tokens: int = 64
    steps: int = 8  # optimizer steps per leg
    repeats: int = 3  # interleaved rounds of every trainer
    trainers: list[str] = field(default_factory=lambda: list(TRAINERS))
    lr: float = 1e-6  # TRL's default learning rate
    temperature: float = 1.0  # TRL's default sampling temperature
    clip: float = 0.2  # PPO clip both sides (TRL's epsilon)
    loss_type: str = "dapo"  # TRL's loss aggregation (its default), mapped to ours
    alpha: float = 1.0  # ours async: batches generation may run ahead
    eval_episodes: int = 20  # held-out problems per reading
    eval_every: int = 0  # a held-out reading every N steps too (0: at the start and the end only)
    # torch threads of each process's work: TRL's one loop; ours sync, the engine and the trainer in turn;
    # ours async, each of them at once (the second core TRL and sync leave idle is what async overlaps onto).
    # More than 1 on a shared, loaded machine collapses: OpenMP workers wait on each other at every small op
    threads: int = 1
    # recompute activations in the backward pass, both trainers (TRL's GRPOConfig defaults to it, ours not:
    # it trades a forward pass per step for memory, which these models do not need)
    gradient_checkpointing: bool = False
    seed: int = 0

    def validate(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {', '.join(MODELS)}, got {self.model!r}")
        for key, low in (("prompts", 1), ("group", 2), ("max_new_tokens", 1), ("steps", 1), ("repeats", 1)):
            if getattr(self, key) < low:
                raise ValueError(f"{key} must be >= {low}, got {getattr(self, key)}")
        for key, low in (("eval_episodes", 1), ("eval_every", 0), ("threads", 1), ("seed", 0)):
            if getattr(self, key) < low:
                raise ValueError(f"{key} must be >= {low}, got {getattr(self, key)}")
        unknown = [t for t in self.trainers if t not in TRAINERS]
        if unknown or not self.trainers or len(set(self.trainers)) != len(self.trainers):
            raise ValueError(f"trainers must be distinct names among {', '.join(TRAINERS)}, got {self.trainers}")
        if not (self.lr > 0 and self.temperature > 0 and self.alpha > 0):
            raise ValueError("lr, temperature and alpha must be > 0")
        if not 0 < self.clip < 1:
            raise ValueError(f"clip must be in (0, 1), got {self.clip}")
        if self.loss_type not in TRL_LOSS_AGGREGATION:
            raise ValueError(
                f"loss_type must be one of {', '.join(TRL_LOSS_AGGREGATION)} (those ours can match), got "
                f"{self.loss_type!r}"
            )


QUICK = [
    "model=tiny",
    "steps=2",
    "repeats=1",
    "prompts=2",
    "group=4",
    "max_new_tokens=16",
    "eval_episodes=4",
    "eval_every=1",
    "threads=1",
]


def recipe_overrides(cfg: PeerTrlConfig, run_dir: Path, model_dir: Path | None, trainer: str) -> list[str]:
    """The recipe laid under the comparison's settings, for one leg (`trainer`: trl, sync or async)."""
    overrides = [
        f"run_dir={run_dir}",
        f"seed={cfg.seed}",
        f"rollout.group_size={cfg.group}",
        f"rollout.groups_per_batch={cfg.prompts}",
        f"agent.max_new_tokens={cfg.max_new_tokens}",
        f"agent.temperature={cfg.temperature}",
        "agent.top_p=1.0",
        "agent.top_k=-1",
        "agent.format_penalty=0.0",
        f"optim.lr={cfg.lr}",
        f"optim.micro_batch_size={cfg.prompts * cfg.group}",  # one forward over the batch, as TRL's
        "optim.warmup_steps=0",
        "optim.lr_end_factor=1.0",
        "optim.minibatches=1",
        "optim.epochs=1",
        "optim.pack_tokens=null",
        "algorithm.estimator=grpo",
        "algorithm.normalize_std=true",
        "algorithm.drop_zero_advantage_groups=false",
        "loss.objective=ppo",
        f"loss.clip_low={cfg.clip}",
        f"loss.clip_high={cfg.clip}",
        "loss.dual_clip=null",
        "loss.correction=none",
        f"loss.aggregation={TRL_LOSS_AGGREGATION[cfg.loss_type]}",
        "loss.kl_coef=0.0",
        "loss.entropy_coef=0.0",
        f"train.steps={cfg.steps}",
        "train.checkpoint_every=0",
        "train.log_trajectories=false",
        "train.max_wall_s=null",
        "train.max_job_wall_s=null",
        "sft.enabled=false",
        f"model.gradient_checkpointing={str(cfg.gradient_checkpointing).lower()}",
        f"eval.episodes={cfg.eval_episodes}",
        f"eval.every={cfg.eval_every}",
        "eval.temperature=0.0",
        "eval.samples_per_seed=1",
        "eval.greedy=false",
        "eval.select.episodes=0",
        "eval.in_trainer=false",  # both sides are read by one evaluator on one engine
    ]
    if cfg.model == "tiny":  # built at model_dir on first use; generated in-process, as TRL does
        overrides += [f"model.path={model_dir}", "model.export=null", f"model.init_tiny={cfg.tiny_size}"]
        overrides += ["engine.backend=inprocess"]
    elif model_dir is not None:  # the recipe's model, once it is exported
        overrides += [f"model.path={model_dir}"]
    if trainer == "async":
        overrides += ["rollout.lockstep=false", f"rollout.async_ratio={cfg.alpha}"]
    else:
        overrides += ["rollout.lockstep=true", "rollout.async_ratio=0"]
    return [*overrides, f"model.threads={cfg.threads}", f"engine.threads={cfg.threads}"]


def check_single_turn(config: Any) -> None:
    """TRL's GRPOTrainer scores one completion per prompt: refuse an env that plays more turns."""
    from rollhub.envs.registry import make

    env = make(config.env.id, **config.env.kwargs)
    if env.tools:
        raise UserError(
            f"peer-trl has no tool leg: {config.env.id} gives the agent tools, and TRL's GRPOTrainer(tools=...) "
            "runs tool calls only for chat templates it can parse (trl.chat_template_utils.add_response_schema: "
            "Qwen, Llama 3, GLM, gpt-oss and a few more; SmolLM2's template is not one of them, and it ignores "
            "the tool schema the trainer would render through it); compare on configs/math_smollm2.yaml"
        )
    if env.max_steps != 1:
        raise UserError(
            f"peer-trl compares single-turn training; {config.env.id} with these arguments plays up to "
            f"{env.max_steps} turns: use a single-turn recipe "
            "(configs/math_smollm2.yaml) or set its env to one attempt"
        )


def leg_order(trainers: list[str], round_index: int) -> list[str]:
    """The trainers of one round, rotated by the round so none always runs first."""
    shift = round_index % len(trainers)
    return trainers[shift:] + trainers[:shift]


def steady_step_s(leg: dict[str, Any], eval_every: int) -> list[float]:
    """A leg's step times without its first step and the steps right after a periodic reading."""
    return [
        seconds
        for index, seconds in enumerate(leg["step_s"], start=1)
        if index > 1 and not (eval_every and (index - 1) % eval_every == 0)
    ] or leg["step_s"]


def run(args: argparse.Namespace) -> dict[str, Any]:
    overrides = [*QUICK, *args.overrides] if args.quick else list(args.overrides)
    if getattr(args, "target", None):
        overrides.append(f"model={args.target}")
    cfg = load_config(PeerTrlConfig, None, overrides)
    if "trl" in cfg.trainers and importlib.util.find_spec("trl") is None:
        raise MissingExtraError("trl", "rollhub bench peer-trl (TRL's GRPOTrainer)")
    out = Path(args.out).resolve()
    if out.exists():  # a fresh comparison: the trainer refuses to overwrite a run folder
        if any(out.iterdir()) and not (out / "legs").is_dir():
            raise UserError(f"{out} exists and holds no earlier peer-trl output: choose another --out")
        shutil.rmtree(out)
    out.mkdir(parents=True)

    from rollhub.trainer.build import ensure_model
    from rollhub.trainer.config import RunConfig

    def leg_config(trainer: str, run_dir: Path, model_dir: Path | None) -> RunConfig:
        return load_config(RunConfig, cfg.recipe, recipe_overrides(cfg, run_dir, model_dir, trainer))

    probe = leg_config("sync", out / "legs" / "probe", out / "model" if cfg.model == "tiny" else None)
    check_single_turn(probe)
    model_dir = ensure_model(probe).resolve()
    started = time.perf_counter()
    legs: list[dict[str, Any]] = []
    for round_index in range(cfg.repeats):
        for trainer in leg_order(cfg.trainers, round_index):
            run_dir = out / "legs" / f"{trainer}-{round_index}"
            config = leg_config(trainer, run_dir, model_dir)
            logger.info("round %d: %s", round_index + 1, trainer)
            t0 = time.perf_counter()
            if trainer == "trl":
                run_dir.mkdir(parents=True)
                leg = run_trl(config, model_dir, run_dir, steps=cfg.steps, loss_type=cfg.loss_type, threads=cfg.threads)
            else:
                leg = run_ours(config)
            legs.append({"trainer": trainer, "round": round_index, "wall_s": time.perf_counter() - t0, **leg})
    report = summarise(cfg, legs)
    report["wall_s"] = time.perf_counter() - started
    report["model_dir"] = str(model_dir)
    print_table(
        f"peer-trl: {cfg.model} model, {cfg.prompts} prompts x {cfg.group}, {cfg.max_new_tokens} tokens, "
        f"{cfg.steps} steps x {cfg.repeats} interleaved rounds",
        report["rows"],
    )
    for name, ratio in report["ratios"].items():
        print(f"{name}: {ratio['median']:.2f}x (rounds: {', '.join(f'{r:.2f}' for r in ratio['by_round'])})")
    save_json(out / "result.json", report)
    save_plot(out / "peer_trl.png", _plot, report, panels=2)
    print(f"wrote {out / 'result.json'} and {out / 'peer_trl.png'}")
    return report


def summarise(cfg: PeerTrlConfig, legs: list[dict[str, Any]]) -> dict[str, Any]:
    """Rows per trainer, seconds-per-step ratios against TRL (overall and round by round)."""
    rows = []
    per_leg: dict[tuple[str, int], float] = {}
    for trainer in cfg.trainers:
        mine = [leg for leg in legs if leg["trainer"] == trainer]
        steady = [s for leg in mine for s in steady_step_s(leg, cfg.eval_every)]
        for leg in mine:
            per_leg[(trainer, leg["round"])] = statistics.fmean(steady_step_s(leg, cfg.eval_every))
        rows.append(
            {
                "trainer": trainer,
                "legs": len(mine),
                "steps": sum(leg["steps"] for leg in mine),
                "s_per_step": statistics.median(steady),
                "s_per_step_min": min(per_leg[(trainer, leg["round"])] for leg in mine),
                "s_per_step_max": max(per_leg[(trainer, leg["round"])] for leg in mine),
                "first_step_s": statistics.fmean(leg["step_s"][0] for leg in mine),
                "held_out_start": statistics.fmean(leg["readings"][0]["success"] for leg in mine),
                "held_out_end": statistics.fmean(leg["readings"][-1]["success"] for leg in mine),
                "train_s": statistics.fmean(leg["readings"][-1]["train_s"] for leg in mine),
                "leg_wall_s": statistics.fmean(leg["wall_s"] for leg in mine),
            }
        )
    by_trainer = {row["trainer"]: row for row in rows}
    ratios = {}
    if "trl" in by_trainer:
        for ours in ("sync", "async"):
            if ours in by_trainer:
                ratios[f"ours {ours} speed-up over TRL (s/step)"] = {
                    "median": by_trainer["trl"]["s_per_step"] / by_trainer[ours]["s_per_step"],
                    "by_round": [
                        per_leg[("trl", r)] / per_leg[(ours, r)]
                        for r in range(cfg.repeats)
                        if ("trl", r) in per_leg and (ours, r) in per_leg
                    ],
                }
    return {
        "benchmark": "peer-trl",
        "config": asdict(cfg),
        "rows": rows,
        "ratios": ratios,
        "legs": legs,
    }


def _plot(axes: Any, report: dict[str, Any]) -> None:
    colors = {"trl": "tab:red", "sync": "tab:blue", "async": "tab:green"}
    labels = {"trl": "TRL GRPOTrainer", "sync": "ours, synchronous", "async": "ours, asynchronous"}
    seen: set[str] = set()
    for leg in report["legs"]:
        trainer = leg["trainer"]
        xs = [r["train_s"] for r in leg["readings"]]
        ys = [r["success"] for r in leg["readings"]]
        label = None if trainer in seen else labels[trainer]
        seen.add(trainer)
        axes[0].plot(xs, ys, "o-", color=colors[trainer], alpha=0.8, label=label)
        axes[1].plot(range(1, len(leg["step_s"]) + 1), leg["step_s"], ".-", color=colors[trainer], label=label)
    axes[0].set_xlabel("training wall time (s, held-out readings excluded)")
    axes[0].set_ylabel("held-out success (greedy)")
    axes[1].set_xlabel("step")
    axes[1].set_ylabel("seconds per step")
    for ax in axes:
        ax.legend()
        ax.grid(alpha=0.3)
