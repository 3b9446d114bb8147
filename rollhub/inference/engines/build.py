"""The one place an inference engine is built from its config.

`rollhub train`, `eval`, `sft`, `rollout` and `serve`, and the Ray engine servers all build
their engine here, so an engine knob is added once (the `engine:` section of a recipe) and
reaches every command. Two backends:

* `inprocess` (default): the transformers engine (`HFEngine`) in this process;
* `server`: an `EngineRouter` over SGLang-speaking servers, either launched by rollhub from
  a command template (`launch:`, `replicas:`; `rollhub` and `sglang` name built-in
  templates) or attached by URL (`urls:`). See rollhub.inference.engines.launcher.
  Launched servers run on this machine (`placement: local`) or on nodes Ray picks
  (`placement: ray`, one actor per server with `ray_num_cpus`/`ray_num_gpus`); the same
  launcher, watchdog, replacement and weight sync serve both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal


@dataclass
class EngineConfig:
    """`engine:` section: which engine generates, and its knobs. Device: the run's `model.device`."""

    backend: Literal["inprocess", "server"] = "inprocess"  # inprocess: in this process; server: HTTP replicas
    threads: int = 1  # torch threads of the engine (the trainer has its own, model.threads)
    max_batch_size: int = 64  # requests decoded together
    seed: int = 0  # sampling seed of the engine (replica i of a server backend: seed + i)
    # weights and compute of the engine (in-process, or launched `rollhub serve` replicas): auto = bf16 on
    # CUDA, fp32 on the CPU; bfloat16 on a CPU with AMX (Sapphire Rapids and later) prefills ~1.7x faster
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    # a prompt repeated under one weight version (the samples of a group on the same board) takes
    # its twin's KV and first-token logits instead of a forward (exact; off = every prompt runs)
    share_prompts: bool = True
    # --- backend: server ---
    # command template for launched servers: "rollhub" (rollhub serve), "sglang", or a command with
    # {python} {model} {host} {port} {replica} {threads} {max_batch_size} {seed} {device} {dtype} {api_key}
    # {tp} {gpus} {mem_fraction} (dtype is never "auto" there: bfloat16 on a GPU, float32 on the CPU);
    # null with no urls = "rollhub"
    launch: str | None = None
    replicas: int = 1  # launched servers, each on its own port
    # where launched servers run: local = child processes of this one; ray = one Ray actor per server,
    # placed by Ray with the resources below (the Ray connection is the run's cluster.address)
    placement: Literal["local", "ray"] = "local"
    ray_num_cpus: float = 0.5  # Ray resources of one server (placement: ray)
    ray_num_gpus: float | None = None  # null = engine.tp for the sglang template, 0 otherwise
    # a launched server that goes down (exited, hung) is relaunched in its slot from the latest weights
    # this many times per run; 0 = it stays down and its peers serve
    max_replacements: int = 0
    urls: list[str] = field(default_factory=list)  # attach to running servers instead of launching
    host: str = "127.0.0.1"  # where launched servers listen
    base_port: int = 0  # replica i listens on base_port + i; 0 = a free port each
    startup_timeout_s: float = 600.0  # until /health_generate answers (model load, warm-up)
    watchdog_interval_s: float = 1.0  # how often each replica is asked /ping (never while paused or pushing)
    watchdog_timeout_s: float = 3.0  # /ping unanswered this long, watchdog_misses times in a row = hung or dead
    watchdog_misses: int = 2  # consecutive missed /ping answers before a replica is declared dead
    # /health_generate (a real generation) this often; unanswered this long while no request finishes = wedged
    watchdog_generate_timeout_s: float = 30.0
    request_timeout_s: float = 3600.0  # one HTTP call; a hung server is caught by the watchdog long before
    max_reroutes: int = 1  # re-sends of a request whose replica failed; then it fails as infra
    # how new weights reach the servers; lora_adapter: a LoRA policy's adapter through SGLang's
    # /load_lora_adapter (servers launched with --enable-lora), instead of merged weights
    weight_sync: Literal["disk", "distributed", "lora_adapter"] = "disk"
    # distributed sync: auto = nccl when every server has GPUs of its own, gloo when one shares the trainer's
    weight_sync_backend: Literal["auto", "nccl", "gloo"] = "auto"
    # where servers reach the trainer for the update group: loopback only serves servers on this machine
    weight_sync_master_address: str = "127.0.0.1"
    tp: int = 1  # GPUs per launched replica (SGLang --tp-size); the update group gives each its tp ranks
    gpus: list[int] = field(default_factory=list)  # GPUs launched servers use; [] = every GPU the trainer does not
    # let servers use the trainer's GPU(s) when too few others exist (one-GPU machines)
    share_gpu: bool = False
    # the server's static share of each GPU it uses (SGLang --mem-fraction-static); null = SGLang's default,
    # or launcher.SHARED_MEM_FRACTION on a GPU shared with the trainer
    mem_fraction: float | None = None
    server_python: str | None = None  # interpreter of launched servers ({python}): e.g. a venv with sglang
    weights_dir: str | None = None  # disk sync folder all servers can read; default RUN_DIR/weights
    log_dir: str | None = None  # launched servers' logs; default RUN_DIR/servers

    def validate(self) -> None:
        if self.threads < 1 or self.max_batch_size < 1:
            raise ValueError("engine.threads and engine.max_batch_size must be >= 1")
        if self.seed < 0:
            raise ValueError(f"engine.seed must be >= 0, got {self.seed}")
        if self.dtype not in ("auto", "float32", "bfloat16"):
            raise ValueError(f"engine.dtype must be auto, float32 or bfloat16, got {self.dtype!r}")
        if self.backend == "server" and self.dtype != "auto" and not self._launch_takes_dtype():
            raise ValueError(
                f"engine.dtype={self.dtype} reaches launched servers through {{dtype}} in engine.launch (the "
                "rollhub template passes it); attached servers (engine.urls) or a template without {dtype} set "
                "their own: set engine.dtype=auto, or add --dtype {dtype} to the template"
            )
        if self.replicas < 1:
            raise ValueError(f"engine.replicas must be >= 1, got {self.replicas}")
        if self.placement not in ("local", "ray"):
            raise ValueError(f"engine.placement must be local or ray, got {self.placement!r}")
        if self.placement == "ray" and (self.backend != "server" or self.urls):
            raise ValueError("engine.placement=ray places launched servers: set engine.backend=server, no engine.urls")
        if self.placement == "ray" and (self.gpus or self.share_gpu or self.base_port):
            raise ValueError(
                "engine.gpus, engine.share_gpu and engine.base_port place local servers; with engine.placement=ray "
                "Ray picks node, port and GPUs (engine.ray_num_gpus)"
            )
        if not self.ray_num_cpus >= 0 or (self.ray_num_gpus is not None and not self.ray_num_gpus >= 0):
            raise ValueError("engine.ray_num_cpus and engine.ray_num_gpus must be >= 0")
        if self.max_replacements < 0:
            raise ValueError(f"engine.max_replacements must be >= 0, got {self.max_replacements}")
        if self.launch is not None and self.urls:
            raise ValueError("engine.launch and engine.urls exclude each other: launch servers or attach to them")
        for url in self.urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"engine.urls entries must be http(s) URLs, got {url!r}")
        if not 0 <= self.base_port <= 65535 - self.replicas:
            raise ValueError(f"engine.base_port must be in [0, {65535 - self.replicas}], got {self.base_port}")
        if self.watchdog_misses < 1:
            raise ValueError(f"engine.watchdog_misses must be >= 1, got {self.watchdog_misses}")
        timeouts = ("startup_timeout_s", "watchdog_interval_s", "watchdog_timeout_s", "watchdog_generate_timeout_s")
        for name in (*timeouts, "request_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"engine.{name} must be > 0, got {getattr(self, name)}")
        if self.max_reroutes < 0:
            raise ValueError(f"engine.max_reroutes must be >= 0, got {self.max_reroutes}")
        if self.tp < 1:
            raise ValueError(f"engine.tp must be >= 1, got {self.tp}")
        if self.mem_fraction is not None and not 0 < self.mem_fraction < 1:
            raise ValueError(f"engine.mem_fraction must be in (0, 1), got {self.mem_fraction}")
        if self.weight_sync_backend not in ("auto", "nccl", "gloo"):
            raise ValueError(f"engine.weight_sync_backend must be auto, nccl or gloo, got {self.weight_sync_backend!r}")
        if self.launch is not None:
            from rollhub.inference.engines.launcher import template_words

            try:
                template_words(self.launch)
            except Exception as exc:  # UserError: reported under the section's key
                raise ValueError(str(exc)) from None

    def _launch_takes_dtype(self) -> bool:
        """Whether launched servers are told `engine.dtype` (attached ones are not launched by us)."""
        if self.urls:
            return False
        from rollhub.inference.engines.launcher import template_words

        try:
            return any("{dtype}" in word for word in template_words(self.launch or "rollhub"))
        except Exception:  # a bad template is reported below, under its own key
            return True


def resolve_device(device: str) -> str:
    """`auto` -> "cuda" when a GPU is present, else "cpu"; an explicit device is checked, never replaced."""
    from rollhub.inference.engines.placement import resolve_device as check

    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return str(check(device))


def build_engine(
    config: EngineConfig,
    model: str | Path | Any,
    *,
    device: str = "cpu",
    run_dir: str | Path | None = None,
    **overrides: Any,
) -> Any:
    """The engine of `config` over `model` (a checkpoint dir; a loaded model for `inprocess` only).

    `device` places the in-process engine (bf16 on CUDA, fp32 on the CPU) and is passed to
    launched servers as `{device}`. `run_dir` holds launched servers' logs and the disk
    weight sync's folders. `overrides` are further `HFEngine` arguments for callers that
    measure the engine itself (prefix cache size, stop tokens); a run's engine takes its
    config alone. A `server` engine must be started (`await engine.start()`, or
    `launcher.start_engine`) before use; its first request starts it otherwise.
    """
    device = resolve_device(device)
    if config.backend == "server":
        return _build_server_engine(config, model, device, Path(run_dir) if run_dir is not None else None)
    from rollhub.inference.engines.hf import HFEngine

    arguments = {
        "threads": config.threads,
        "max_batch_size": config.max_batch_size,
        "seed": config.seed,
        "device": device,
        "dtype": None if config.dtype == "auto" else config.dtype,
        "share_prompts": config.share_prompts,
        **overrides,
    }
    return HFEngine(model, **arguments)


def trainer_gpus(device: str, environ: dict[str, str] | None = None) -> list[int]:
    """The GPUs the trainer's ranks on this machine use: `cuda:N` -> [N]; `cuda` -> one per local
    rank (LOCAL_WORLD_SIZE, as torchrun and rollhub's rank launcher set it); the CPU -> []."""
    import os

    env = environ if environ is not None else os.environ
    if not device.startswith("cuda"):
        return []
    if ":" in device:
        return [int(device.split(":", 1)[1])]
    return list(range(int(env.get("LOCAL_WORLD_SIZE") or env.get("WORLD_SIZE") or 1)))


def _build_server_engine(
    config: EngineConfig, model: Any, device: str, run_dir: Path | None, visible_gpus: int | None = None
) -> Any:
    from rollhub.core.errors import UserError
    from rollhub.inference.engines.launcher import SHARED_MEM_FRACTION, ServerEngine, plan_gpus

    if not isinstance(model, (str, Path)):
        raise UserError("engine.backend=server serves a model dir, not a loaded model")
    base = run_dir if run_dir is not None else Path("runs/engine")
    weights_dir = Path(config.weights_dir) if config.weights_dir else base / "weights"
    launch = None if config.urls else (config.launch or "rollhub")
    plan, shared = None, False
    placement = None
    if config.placement == "ray":
        from rollhub.inference.engines.hosts import RayHost

        placement = RayHost(
            num_cpus=config.ray_num_cpus, num_gpus=ray_gpus(config, launch), timeout_s=config.startup_timeout_s
        )
    elif launch is not None:
        if visible_gpus is None:
            import torch

            visible_gpus = torch.cuda.device_count()
        plan, shared = plan_gpus(
            replicas=config.replicas,
            tp=config.tp,
            visible=visible_gpus,
            trainer_gpus=trainer_gpus(device),
            gpus=list(config.gpus),
            share=config.share_gpu,
        )
    mem_fraction = config.mem_fraction if config.mem_fraction is not None else (SHARED_MEM_FRACTION if shared else None)
    return ServerEngine(
        str(model),
        launch=launch,
        replicas=config.replicas,
        urls=list(config.urls),
        host=config.host,
        base_port=config.base_port,
        log_dir=Path(config.log_dir) if config.log_dir else base / "servers",
        startup_timeout_s=config.startup_timeout_s,
        template_values={
            "model": str(model),
            "threads": config.threads,
            "max_batch_size": config.max_batch_size,
            "seed": config.seed,
            "device": device,
            "dtype": config.dtype,
            "tp": config.tp,
        },
        gpu_plan=plan,
        mem_fraction=mem_fraction,
        server_python=config.server_python,
        placement=placement,
        max_replacements=config.max_replacements,
        timeout_s=config.request_timeout_s,
        watchdog_interval_s=config.watchdog_interval_s,
        watchdog_timeout_s=config.watchdog_timeout_s,
        watchdog_misses=config.watchdog_misses,
        watchdog_generate_timeout_s=config.watchdog_generate_timeout_s,
        max_reroutes=config.max_reroutes,
        weight_sync=make_weight_sync(
            config.weight_sync,
            weights_dir,
            str(model),
            shared_gpu=shared,
            backend=config.weight_sync_backend,
            master_address=config.weight_sync_master_address,
            dtype=serving_dtype(config, launch, on_gpu=plan is not None or bool(placement and placement.num_gpus)),
            server_python=config.server_python if launch is not None else None,
        ),
        weights_dir=weights_dir,
    )


def ray_gpus(config: EngineConfig, launch: str | None) -> float:
    """GPUs Ray gives each server: engine.ray_num_gpus, else engine.tp for SGLang (GPU only), else none."""
    if config.ray_num_gpus is not None:
        return config.ray_num_gpus
    return float(config.tp) if (launch or "").strip() == "sglang" else 0.0


def serving_dtype(config: EngineConfig, launch: str | None, *, on_gpu: bool) -> str | None:
    """The dtype launched servers serve in (what `{dtype}` becomes), so pushes are cast before they
    are sent; None for attached servers, whose dtype is theirs."""
    if launch is None:
        return None
    if config.dtype != "auto":
        return config.dtype
    return "bfloat16" if on_gpu or launch.strip() == "sglang" else None


def make_weight_sync(
    kind: str,
    weights_dir: Path,
    model_path: str,
    *,
    shared_gpu: bool = False,
    backend: str = "auto",
    master_address: str = "127.0.0.1",
    dtype: str | None = None,
    server_python: str | None = None,
) -> Any:
    """The `engine.weight_sync` method: `disk` (versioned folders under `weights_dir`, written
    atomically, older ones removed) or `distributed` (a torch.distributed group of the trainer
    and every replica; gloo on CPU, NCCL on GPU). With a server on the trainer's GPU the group
    cannot be NCCL (it refuses two ranks on one GPU), nor across a server interpreter whose torch
    links another NCCL version, so `auto` becomes gloo there (with the reason logged) and an
    explicit nccl is refused. See rollhub.inference.weight_sync."""
    try:
        from rollhub.inference.weight_sync import build_weight_sync
    except ImportError:  # an older tree: the router's own disk push
        build_weight_sync = None  # type: ignore[assignment]
    if build_weight_sync is not None:
        if kind == "disk":
            return build_weight_sync("disk", weights_dir=weights_dir, config_dir=model_path)
        if kind == "lora_adapter":
            return build_weight_sync("lora_adapter", weights_dir=weights_dir)
        if kind == "distributed" and backend != "gloo":
            backend = update_backend(backend, shared_gpu=shared_gpu, server_python=server_python)
        return build_weight_sync(kind, backend=backend, master_address=master_address, dtype=dtype)
    if kind != "disk":
        from rollhub.core.errors import UserError

        raise UserError(f"engine.weight_sync={kind} is not available in this version; use disk")
    from rollhub.inference.engines.router import DiskPush

    return DiskPush(weights_dir, model_path)


def update_backend(requested: str, *, shared_gpu: bool, server_python: str | None) -> str:
    """`auto` or `nccl` resolved against both sides' NCCL, read at start: servers launched with this
    interpreter (or attached ones, whose interpreter is unknown and assumed to match) link the
    trainer's NCCL; a `server_python` is asked for its own."""
    import logging
    import os
    import sys

    import torch

    from rollhub.inference.weight_sync import choose_update_backend, local_nccl_version, nccl_version_of

    trainer = local_nccl_version()
    if requested == "auto" and not shared_gpu and (trainer is None or not torch.cuda.is_available()):
        return "gloo"  # a CPU trainer: gloo is what auto always meant here
    same = server_python is None or os.path.realpath(server_python) == os.path.realpath(sys.executable)
    server = trainer if same else nccl_version_of(server_python)
    backend, reason = choose_update_backend(requested, shared_gpu=shared_gpu, trainer_nccl=trainer, server_nccl=server)
    if reason and not (shared_gpu and requested == "auto"):
        logging.getLogger(__name__).warning(reason)
    return backend
