"""Typed configuration of `rollhub train` / `rollhub sft` (loaded with rollhub.core.config.load_config).

Sections mirror the data flow: model -> env -> agent -> rollout -> algorithm -> loss ->
optim -> train, plus the optional SFT warm-start and the held-out evaluation. Builders in
the loop read these and hand plain arguments to the classes (classes never take configs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from rollhub.rollout.agent import AgentConfig
from rollhub.rollout.cluster.config import ClusterConfig
from rollhub.trainer.losses import LossConfig


@dataclass
class ModelConfig:
    path: str = "runs/models/tiny-5m"  # HF checkpoint dir
    init_tiny: str | None = "5m"  # build a random-init tiny model at `path` when it is missing; null = must exist
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
    lockstep: bool = False  # step all envs of a batch together (the synchronous baseline)
    engine_threads: int = 1
    engine_max_batch_size: int = 64
    seed: int = 0

    def validate(self) -> None:
        if self.group_size < 1 or self.groups_per_batch < 1:
            raise ValueError("group_size and groups_per_batch must be >= 1")
        if self.async_ratio < 0:
            raise ValueError("async_ratio must be >= 0 (0 = synchronous)")


@dataclass
class AlgorithmConfig:
    estimator: Literal["gigpo", "grpo"] = "gigpo"
    omega: float = 1.0  # GiGPO step-advantage weight
    episode_weight: float = 1.0  # GiGPO episode-advantage weight (ROLL's episode_reward_weight)
    gamma: float = 0.95  # GiGPO step-return discount
    normalize_std: bool = False
    episode_baseline: Literal["trajectory", "step_weighted"] = "trajectory"
    invalid_action_penalty: float = 0.0  # extra penalty (<= 0) on turns the env rejected
    drop_zero_advantage_groups: bool = False  # DAPO-style filter of groups with equal rewards
    drop_zero_advantage_sequences: bool = False  # skip sequences whose tokens all have A = 0 (no gradient, full cost)
    # a turn the env rejected gets min(A, invalid_action_penalty): never reinforced (rollhub/trainer/batch.py)
    cap_invalid_advantage: bool = True

    def advantage_kwargs(self) -> dict:
        """What `build_training_batch` needs from this section (one list for every caller)."""
        return {
            "drop_zero_advantage_groups": self.drop_zero_advantage_groups,
            "drop_zero_advantage_sequences": self.drop_zero_advantage_sequences, "estimator": self.estimator, "omega": self.omega,
            "gamma": self.gamma, "normalize_std": self.normalize_std, "episode_baseline": self.episode_baseline,
            "invalid_action_penalty": self.invalid_action_penalty, "cap_invalid_advantage": self.cap_invalid_advantage,
            "episode_weight": self.episode_weight,
        }

    def validate(self) -> None:
        if self.invalid_action_penalty > 0:
            raise ValueError("invalid_action_penalty is a penalty: use a value <= 0")
        if not 0 <= self.gamma <= 1:
            raise ValueError("gamma must be in [0, 1]")
        if self.episode_weight < 0 or self.omega < 0:
            raise ValueError("algorithm.episode_weight and algorithm.omega must be >= 0")


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
    # false: RL leaves the token embeddings (and a tied output head) frozen. A sampled rare
    # token gives its row a gradient once in a while; Adam turns each such event into a
    # ~lr/sqrt(1 - beta2) (~30 lr) cumulative move of that row. On the tiny model, single
    # steps with KL(mu||pi_prox) 0.9-1.3 and format-error bursts became smaller (<= 0.25)
    # with the embeddings frozen, though not gone (README, Training)
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
    # DART-style noise: each demo turn plays a random move with this probability. Those turns
    # are context, not labels; the expert's next moves (from the off-path state, often after
    # an "Invalid: ..." reply) are. Clean demos never show a recovery, and a policy that
    # leaves the expert's path is then lost (measured: P(wall move | last move hit a wall)
    # 0.69 vs 0.04-0.15 otherwise)
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
    # seed adds ~4.5 points of sampling noise on 100 seeds to every reading)
    samples_per_seed: int = 1

    def validate(self) -> None:
        if self.samples_per_seed < 1:
            raise ValueError(f"samples_per_seed must be >= 1, got {self.samples_per_seed}")
        if self.episodes < 0:
            raise ValueError(f"episodes must be >= 0, got {self.episodes}")

    @property
    def label(self) -> str:
        """How a reading is described: '100 held-out seeds' or '100 held-out seeds x 4 samples'."""
        return f"{self.episodes} held-out seeds" + (f" x {self.samples_per_seed} samples" if self.samples_per_seed > 1 else "")

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
        for name, start in (("env.train_seed_offset", self.env.train_seed_offset), ("sft.seed_offset", self.sft.seed_offset)):
            if start in held_out:
                raise ValueError(f"{name} overlaps the evaluation seeds starting at eval.seed_offset={self.eval.seed_offset}")
