"""Typed configuration of `rollhub train` / `sft` / `eval` (loaded with rollhub.core.config.load_config).

Sections mirror the data flow: model -> engine -> env -> agent -> rollout -> algorithm ->
loss -> optim -> train, plus the optional SFT warm-start and the held-out evaluation. Each
knob has one place: a section that configures one component is defined beside it
(`AgentConfig` in rollhub.rollout.agent, `EngineConfig` in rollhub.rollout.engines.build,
`AlgorithmConfig` in rollhub.trainer.batch, `LossConfig` in rollhub.trainer.losses) and
reaches it whole through the composition root, rollhub.trainer.build.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from rollhub.rollout.agent import AgentConfig
from rollhub.rollout.cluster.config import ClusterConfig
from rollhub.rollout.engines.build import EngineConfig
from rollhub.trainer.batch import AlgorithmConfig
from rollhub.trainer.losses import LossConfig


@dataclass
class ModelConfig:
    path: str = "runs/models/tiny-5m"  # HF checkpoint dir
    init_tiny: Literal["5m", "30m"] | None = (
        "5m"  # build a random-init tiny model at `path` when it is missing; null = must exist
    )
    device: str = "auto"  # auto = cuda (bf16) when present, else cpu (fp32)
    threads: int = 1  # torch threads of the trainer (the engine has its own)
    gradient_checkpointing: bool = False
    fsdp: bool = False  # FSDP2 across the torch.distributed group (GPU runs launched by torchrun)

    def validate(self) -> None:
        if self.threads < 1:
            raise ValueError("threads must be >= 1")


@dataclass
class EnvConfig:
    id: str = "rollhub/Sokoban-v0"
    kwargs: dict[str, Any] = field(default_factory=dict)
    train_seed_offset: int = 0  # training tasks use seeds offset, offset+1, ...
    max_concurrent: int = 64  # env episodes running at once (coroutines)


@dataclass
class RolloutConfig:
    group_size: int = 8  # trajectories per task (same seed)
    groups_per_batch: int = 4  # B: groups per trainer step
    async_ratio: float = 1.0  # alpha: generation may run up to (alpha+1)*B groups ahead; 0 = on-policy
    # Two switches because they are two axes (ROLL Flash, sec. 3): `lockstep` says how envs
    # step (all of a batch together, or each on its own), `async_ratio` how far generation
    # runs ahead of training. Lockstep with async_ratio 0 is the synchronous baseline;
    # independent envs with async_ratio 0 is env-level asynchrony alone. Lockstep with a
    # positive ratio means nothing and is refused.
    lockstep: bool = False

    def validate(self) -> None:
        if self.group_size < 1 or self.groups_per_batch < 1:
            raise ValueError("group_size and groups_per_batch must be >= 1")
        if self.async_ratio < 0:
            raise ValueError("async_ratio must be >= 0 (0 = synchronous)")
        if self.lockstep and self.async_ratio != 0:
            raise ValueError(
                "lockstep runs each batch to the end before training: set async_ratio: 0 with lockstep: true"
            )


@dataclass
class OptimConfig:
    lr: float = 1e-5
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8  # AdamW epsilon; larger values damp the full-size steps Adam gives near-zero gradients
    max_grad_norm: float = 1.0
    micro_batch_size: int = 16
    warmup_steps: int = 0
    lr_end_factor: float = 1.0  # lr decays linearly to lr * lr_end_factor at the last RL step (1 = constant)
    minibatches: int = 1  # PPO mini-batches per batch: each is one optimizer step
    epochs: int = 1  # PPO passes over each batch
    # false: RL leaves the token embeddings (and a tied output head) frozen: Adam turns the
    # rare gradient of a sampled rare token into a ~lr/sqrt(1 - beta2) move of its whole row
    train_embeddings: bool = True

    def validate(self) -> None:
        if self.lr <= 0 or self.micro_batch_size < 1:
            raise ValueError("lr must be > 0 and micro_batch_size >= 1")
        if self.eps <= 0:
            raise ValueError("optim.eps must be > 0")
        if not 0 <= self.lr_end_factor <= 1:
            raise ValueError("lr_end_factor must be in [0, 1]")
        if self.minibatches < 1 or self.epochs < 1:
            raise ValueError("optim.minibatches and optim.epochs must be >= 1")


@dataclass
class TrainConfig:
    steps: int = 20  # trainer steps (policy versions) of RL
    checkpoint_every: int = 5  # 0 = only at the end
    keep_checkpoints: int = 2
    log_trajectories: bool = True  # write trajectories.jsonl for `rollhub view`
    max_wall_s: float | None = None  # stop RL early (cleanly, after a step) when exceeded


@dataclass
class SftConfig:
    enabled: bool = False
    episodes: int = 200  # expert demonstrations (seeds disjoint from evaluation)
    epochs: float = 1.0
    lr: float = 1e-3
    batch_size: int = 32
    seed_offset: int = 500_000
    # DART-style noise: each demo turn plays a random move with this probability; those turns
    # are context, not labels, so the demos show recoveries from off-path states
    noise: float = 0.0

    def validate(self) -> None:
        if not 0.0 <= self.noise < 1.0:
            raise ValueError("sft.noise must be in [0, 1)")


@dataclass
class EvalConfig:
    episodes: int = 100  # held-out seeds (never used for training or SFT)
    seed_offset: int = 1_000_000
    temperature: float = 0.0  # 0 = greedy
    every: int = 0  # also evaluate every N RL steps (0 = only after warm-start and at the end)
    # episodes per held-out seed; the success rate is their mean (at T > 0 one draw per
    # seed adds sampling noise to every reading)
    samples_per_seed: int = 1

    def validate(self) -> None:
        if self.samples_per_seed < 1:
            raise ValueError(f"samples_per_seed must be >= 1, got {self.samples_per_seed}")
        if self.episodes < 0:
            raise ValueError(f"episodes must be >= 0, got {self.episodes}")

    @property
    def label(self) -> str:
        """How a reading is described: '100 held-out seeds' or '100 held-out seeds x 4 samples'."""
        return f"{self.episodes} held-out seeds" + (
            f" x {self.samples_per_seed} samples" if self.samples_per_seed > 1 else ""
        )

    @property
    def seeds(self) -> list[int]:
        """The held-out seeds: the same list for the warm-start, periodic and final evaluations."""
        return list(range(self.seed_offset, self.seed_offset + self.episodes))


@dataclass
class RunConfig:
    """Everything one `rollhub train` run needs."""

    run_dir: str = "runs/train"
    seed: int = 0
    model: ModelConfig = field(default_factory=ModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    sft: SftConfig = field(default_factory=SftConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)  # backend: local | ray (docs/ray.md)

    def validate(self) -> None:
        held_out = self.eval.seeds
        for name, start in (
            ("env.train_seed_offset", self.env.train_seed_offset),
            ("sft.seed_offset", self.sft.seed_offset),
        ):
            if start in held_out:
                raise ValueError(
                    f"{name} overlaps the evaluation seeds starting at eval.seed_offset={self.eval.seed_offset}"
                )
