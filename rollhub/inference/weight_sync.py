"""Weight sync from the trainer to inference servers, over SGLang's protocols.

Pushers with one call, `await pusher.push(clients, state_or_path, version) -> timings`:

* `DiskWeightSync` (`/update_weights_from_disk`): the weights are written once as an HF
  checkpoint folder `v{version}` under the run's weights folder, atomically (written into a
  hidden sibling, fsynced, renamed), every server is told the folder and the version, and
  once every server confirmed, the older `v*` folders are removed. Needs a disk every server
  can read (one machine, or a shared file system).
* `DistributedWeightSync` (`/init_weights_update_group` + `/update_weights_from_distributed`):
  the trainer is rank 0 of a process group with one rank per server (world size = 1 +
  servers) and broadcasts every tensor over it while the servers receive; no disk involved.
  NCCL on GPU, gloo on CPU (`rollhub serve` implements the receiving side of both).
* `LoraAdapterSync` (`/load_lora_adapter`): a LoRA policy's adapter alone, as a peft folder
  `lora-v{version}`, loaded by SGLang servers started with --enable-lora; requests then name it.
  Every other pusher gets the same push as merged weights (rollhub.trainer.lora.LoraWeights).

The update group is a process group of its own, built from a `TCPStore` and the backend
class directly. It is never the default torch.distributed group and never touches it,
because the trainer may itself be one rank of a torchrun group whose collectives must not
interleave with weight broadcasts. The store keys are nested exactly as torch's
`_new_process_group_helper` nests them for a group called `group_name` after SGLang's
`init_custom_process_group` prefixes the store with the same name, so a real SGLang server
and `rollhub serve` both meet the trainer in the same rendezvous.

Neither pusher pauses generation: the caller (the router, the manager) runs pause -> push ->
resume, so every token is produced by exactly one version.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # torch is imported inside functions: the CLI imports this module light
    import torch

    from rollhub.inference.engines.sglang import SGLangEngine

logger = logging.getLogger(__name__)

#: dtypes a weight broadcast may carry (SGLang names them without the "torch." prefix)
BROADCAST_DTYPES = ("float32", "bfloat16", "float16")
#: group names travel in store keys and HTTP bodies: keep them plain
GROUP_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
DEFAULT_GROUP_NAME = "rollhub_weight_update"
VERSION_FOLDER = re.compile(r"^v(\d+)$")
_PARTIAL_PREFIX = ".partial-"
DESTROY_TIMEOUT_S = 10.0  # a wedged server must not hold up the trainer while it drops a group


class WeightSyncError(RuntimeError):
    """A push failed: a server refused or failed the update, or the broadcast timed out."""


# --- dtypes and tensor specs --------------------------------------------------------------


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.bfloat16` -> "bfloat16", the form SGLang's update requests carry."""
    return str(dtype).removeprefix("torch.")


def parse_dtype(name: Any) -> torch.dtype:
    """A dtype name from a request ("float32" or "torch.float32"); only floating dtypes a
    model is served in are accepted, so a request cannot make the receiver allocate odd types."""
    import torch

    if not isinstance(name, str) or name.removeprefix("torch.") not in BROADCAST_DTYPES:
        raise ValueError(f"dtype must be one of {list(BROADCAST_DTYPES)}, got {str(name)[:40]!r}")
    return getattr(torch, name.removeprefix("torch."))


def unique_tensors(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors to push: one name per storage, and `lm_head.weight` left out when it equals
    the input embedding (tied weights; the receiver's tied model updates both from one).
    Copies from `Policy.engine_state_dict()` no longer share storage, hence the value check."""
    import torch

    tensors: dict[str, torch.Tensor] = {}
    seen: set[tuple[int, int, tuple[int, ...]]] = set()
    for name, tensor in state.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key in seen:
            continue
        seen.add(key)
        tensors[name] = tensor
    head, embedding = tensors.get("lm_head.weight"), None
    for name in ("model.embed_tokens.weight", "transformer.wte.weight"):
        embedding = embedding if embedding is not None else tensors.get(name)
    if head is not None and embedding is not None and head.shape == embedding.shape:
        if head.dtype == embedding.dtype and torch.equal(head, embedding):
            del tensors["lm_head.weight"]
    return tensors


def _buckets(tensors: Mapping[str, torch.Tensor], bucket_bytes: int) -> list[list[str]]:
    """Names in order, cut into consecutive buckets of about `bucket_bytes` (one HTTP request each),
    one dtype per bucket: SGLang (0.5.23) refuses a flattened bucket whose tensors are not aligned
    to their own element size, which mixed dtypes can break."""
    buckets: list[list[str]] = [[]]
    size = 0
    dtype = None
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if buckets[-1] and (size + nbytes > bucket_bytes or tensor.dtype != dtype):
            buckets.append([])
            size = 0
        buckets[-1].append(name)
        size += nbytes
        dtype = tensor.dtype
    return [b for b in buckets if b]


#: SGLang's `load_format` for a bucket sent as one broadcast (both supported releases)
FLATTENED_BUCKET = "flattened_bucket"


def flatten_bucket(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The bytes of `tensors`, in order, as one uint8 tensor: SGLang's flattened bucket layout
    (each tensor flattened and viewed as bytes, concatenated), so one broadcast carries them all."""
    import torch

    return torch.cat([t.detach().contiguous().reshape(-1).view(torch.uint8) for t in tensors])


def unflatten_bucket(
    flat: torch.Tensor, names: list[str], dtypes: list[torch.dtype], shapes: list[tuple[int, ...]]
) -> dict[str, torch.Tensor]:
    """The tensors of a flattened bucket (views into `flat`), checked to fill it exactly."""
    import math

    total = sum(math.prod(shape) * dtype.itemsize for dtype, shape in zip(dtypes, shapes))
    if total != flat.numel():
        raise ValueError(f"the bucket holds {flat.numel()} bytes, its tensors {total}")
    tensors: dict[str, torch.Tensor] = {}
    offset = 0
    for name, dtype, shape in zip(names, dtypes, shapes):
        size = math.prod(shape) * dtype.itemsize
        if offset % dtype.itemsize:
            raise ValueError(f"{name}: byte offset {offset} is not aligned to {dtype}")
        tensors[name] = flat[offset : offset + size].view(dtype).reshape(shape)
        offset += size
    return tensors


def read_checkpoint(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of the *.safetensors files of an HF checkpoint folder."""
    from safetensors.torch import load_file

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise WeightSyncError(f"no *.safetensors in {path}")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    return state


# --- checking weights before they reach a served model ---------------------------------------

#: safetensors' dtype tags for the dtypes a weight update may carry
_SAFETENSORS_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}

WeightSpecs = Mapping[str, tuple[tuple[int, ...], Any]]  # name -> (shape, dtype) of the served model


def check_spec(name: Any, shape: tuple[int, ...], dtype: str, specs: WeightSpecs) -> None:
    """One tensor's name, shape and dtype against the served model: the name must be known,
    the shape exact (a row that torch would broadcast over a matrix is refused) and the
    dtype one a model is served in."""
    if name not in specs:
        raise ValueError(f"unknown parameter name {str(name)[:80]!r}: not in the served model")
    expected = tuple(specs[name][0])
    if tuple(shape) != expected:
        raise ValueError(f"shape of {name} must be {list(expected)}, got {list(shape)}")
    if dtype not in BROADCAST_DTYPES:
        raise ValueError(f"{name}: dtype must be one of {list(BROADCAST_DTYPES)}, got {dtype}")


def check_weights(tensors: Mapping[str, torch.Tensor], specs: WeightSpecs) -> None:
    """A whole update, checked before any of it is applied: at least one tensor, every one
    known, of the exact shape, a served dtype, and finite (NaN weights decode garbage for
    every request, and nothing downstream would notice)."""
    import torch

    if not tensors:
        raise ValueError("the update holds no tensors")
    for name, tensor in tensors.items():
        check_spec(name, tuple(tensor.shape), dtype_name(tensor.dtype), specs)
        if not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"{name} holds NaN or infinite values")


def read_checked_checkpoint(path: str | Path, specs: WeightSpecs) -> dict[str, torch.Tensor]:
    """The *.safetensors tensors of a checkpoint folder, checked like a distributed update.

    Names, shapes and dtypes are read from the file headers and checked before any tensor is
    loaded (a wrong shape costs no memory); a name in two files is refused, not silently
    overwritten; values are checked for NaN and infinity once loaded. Raises ValueError."""
    from safetensors import SafetensorError, safe_open

    folder = Path(path)
    if not folder.is_dir():
        raise ValueError(f"{str(path)[:200]} is not a folder")
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors in {str(path)[:200]}")
    owner: dict[str, str] = {}
    tensors: dict[str, torch.Tensor] = {}
    try:
        for file in files:
            with safe_open(str(file), framework="pt", device="cpu") as handle:
                for name in handle.keys():
                    if name in owner:
                        raise ValueError(f"{name} is in both {owner[name]} and {file.name}")
                    owner[name] = file.name
                    piece = handle.get_slice(name)
                    tag = piece.get_dtype()
                    check_spec(name, tuple(piece.get_shape()), _SAFETENSORS_DTYPES.get(tag, tag), specs)
        for file in files:
            with safe_open(str(file), framework="pt", device="cpu") as handle:
                for name in handle.keys():
                    tensors[name] = handle.get_tensor(name)
    except SafetensorError as exc:
        raise ValueError(f"not a readable safetensors checkpoint ({str(exc)[:200]})") from None
    check_weights(tensors, specs)
    return tensors


# --- the update process group ----------------------------------------------------------------


class UpdateGroup:
    """One rank of a weight-update process group that lives beside (never inside) the default
    torch.distributed group. Rank 0 (the trainer) hosts the store and is the broadcast root.

    Every collective is bounded by `timeout_s`: a peer that never shows up makes `broadcast`
    raise instead of hanging. After a failure the group is unusable (its peers may be out of
    step), so callers `close()` it and build a new one.
    """

    def __init__(self, store: Any, backend: Any, backend_name: str, rank: int, world_size: int) -> None:
        self._store = store
        self._backend = backend
        self.backend_name = backend_name
        self.rank = rank
        self.world_size = world_size
        self.device = "cuda" if backend_name == "nccl" else "cpu"

    @staticmethod
    def host_store(master_address: str, master_port: int, world_size: int, timeout_s: float) -> Any:
        """Rank 0's TCPStore; port 0 picks a free port (read it back from `store.port`)."""
        import torch.distributed as dist

        return dist.TCPStore(
            master_address,
            master_port,
            world_size,
            is_master=True,
            timeout=datetime.timedelta(seconds=timeout_s),
            wait_for_workers=False,
        )

    @classmethod
    def join(
        cls,
        *,
        master_address: str,
        master_port: int,
        rank: int,
        world_size: int,
        group_name: str,
        backend: str,
        timeout_s: float,
        store: Any = None,
    ) -> UpdateGroup:
        """Connect (blocking until every rank joined, or `timeout_s`) and return the group."""
        import torch.distributed as dist

        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
        timeout = datetime.timedelta(seconds=timeout_s)
        if store is None:
            store = dist.TCPStore(master_address, master_port, world_size, is_master=rank == 0, timeout=timeout)
        # the nesting torch gives a group named `group_name` after SGLang's own prefix (see module docstring)
        device = "cuda" if backend == "nccl" else "cpu"
        scoped = dist.PrefixStore(f"{device}/", dist.PrefixStore(f"{group_name}/", dist.PrefixStore(group_name, store)))
        if backend == "gloo":
            process_group = dist.ProcessGroupGloo(scoped, rank, world_size, timeout)
        else:
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            options.is_high_priority_stream = False
            process_group = dist.ProcessGroupNCCL(scoped, rank, world_size, options)
        return cls(store, process_group, backend, rank, world_size)

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Broadcast from rank 0 into `tensor` on every rank (blocking; raises on timeout)."""
        import torch.distributed as dist

        if self._backend is None:
            raise WeightSyncError("the weight update group is closed")
        options = dist.BroadcastOptions()
        options.rootRank = 0
        self._backend.broadcast([tensor], options).wait()

    def close(self) -> None:
        """Drop the group and the store connection. Explicit, because a gloo group that timed
        out and is left for the interpreter's exit can abort the process."""
        backend, self._backend = self._backend, None
        if backend is not None:
            try:
                backend.abort()
            except Exception as exc:  # best effort: a group that never formed has nothing to abort
                logger.debug("aborting the update group: %r", exc)
        self._store = None
        del backend


def receive_tensors(
    group: UpdateGroup,
    names: list[str],
    dtypes: list[torch.dtype],
    shapes: list[tuple[int, ...]],
    load_format: str | None = None,
) -> dict[str, torch.Tensor]:
    """The receiving side of one `/update_weights_from_distributed`: one broadcast per name, in
    order, or one for the whole bucket (`load_format` "flattened_bucket"), into fresh buffers
    (the model is untouched until every tensor arrived)."""
    import math

    import torch

    if load_format == FLATTENED_BUCKET:
        total = sum(math.prod(shape) * dtype.itemsize for dtype, shape in zip(dtypes, shapes))
        flat = torch.empty(total, dtype=torch.uint8, device=group.device)
        group.broadcast(flat)
        return unflatten_bucket(flat, names, dtypes, shapes)
    if load_format is not None:
        raise ValueError(f"load_format must be {FLATTENED_BUCKET!r} or absent, got {str(load_format)[:40]!r}")
    received: dict[str, torch.Tensor] = {}
    for name, dtype, shape in zip(names, dtypes, shapes):
        buffer = torch.empty(shape, dtype=dtype, device=group.device)
        group.broadcast(buffer)
        received[name] = buffer
    return received


# --- atomic versioned folders ----------------------------------------------------------------


def _fsync_tree(folder: Path) -> None:
    for item in folder.iterdir():
        if item.is_file():
            with open(item, "rb") as handle:
                os.fsync(handle.fileno())
    _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_version_folder(
    state: Mapping[str, torch.Tensor], weights_dir: Path, version: int, config_dir: str | Path | None
) -> tuple[Path, int]:
    """Write `weights_dir/v{version}` atomically; returns (folder, bytes written).

    A server never sees a half-written folder: the files go into a hidden sibling that is
    fsynced and renamed into place. A folder of the same version (a resumed run pushing
    again) is replaced only after the new one is complete.
    """
    from rollhub.inference.engines.sglang import _write_state_dict

    weights_dir.mkdir(parents=True, exist_ok=True)
    final = weights_dir / f"v{version}"
    partial = weights_dir / f"{_PARTIAL_PREFIX}v{version}-{uuid.uuid4().hex[:8]}"
    partial.mkdir()
    try:
        _write_state_dict(unique_tensors(state), partial, str(config_dir) if config_dir else None)
        _fsync_tree(partial)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    written = sum(item.stat().st_size for item in partial.iterdir() if item.is_file())
    trash = None
    if final.exists():
        trash = weights_dir / f"{_PARTIAL_PREFIX}old-v{version}-{uuid.uuid4().hex[:8]}"
        os.rename(final, trash)
    os.rename(partial, final)
    _fsync_dir(weights_dir)
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)
    return final, written


def remove_old_versions(weights_dir: Path, keep: Path) -> list[Path]:
    """Delete every `v*` folder (and leftover partial one) in weights_dir but `keep`."""
    removed = []
    if not weights_dir.is_dir():
        return removed
    for item in weights_dir.iterdir():
        if item == keep or not item.is_dir():
            continue
        if VERSION_FOLDER.match(item.name) or item.name.startswith(_PARTIAL_PREFIX):
            shutil.rmtree(item, ignore_errors=True)
            removed.append(item)
    return removed


# --- pushers --------------------------------------------------------------------------------


async def _all_or_raise(what: str, clients: list[SGLangEngine], calls: Iterable[Any]) -> list[Any]:
    """Await one call per client; any failure raises one WeightSyncError naming every failed server."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    failures = [f"{client.url}: {result}" for client, result in zip(clients, results) if isinstance(result, Exception)]
    for result in results:
        if isinstance(result, BaseException) and not isinstance(result, Exception):
            raise result  # cancellation and the like are not server failures
    if failures:
        raise WeightSyncError(f"{what} failed on {len(failures)} of {len(clients)} servers: " + "; ".join(failures))
    return results


@dataclass
class DiskWeightSync:
    """Push by writing `weights_dir/v{version}` and calling `/update_weights_from_disk`.

    `weights_dir` must be readable by every server at the same path. `config_dir` gives the
    config and tokenizer files copied next to the weights (default: the served model's
    folder, as `/get_model_info` reports it). A path pushed instead of a state dict is handed
    to the servers as it is, and never deleted.
    """

    weights_dir: str | Path
    config_dir: str | Path | None = None
    method: Literal["disk"] = field(default="disk", init=False)

    def __post_init__(self) -> None:
        self.weights_dir = Path(self.weights_dir)

    async def push(self, clients: list[SGLangEngine], state_or_path: Any, version: int) -> dict[str, Any]:
        """Write (for a state dict), tell every server, then remove older versions."""
        if not clients:
            raise WeightSyncError("no servers to push weights to")
        started = time.perf_counter()
        written_bytes = 0
        owned = isinstance(state_or_path, Mapping)
        if owned:
            config_dir = self.config_dir or await clients[0]._model_path()
            folder, written_bytes = await asyncio.to_thread(
                write_version_folder, state_or_path, Path(self.weights_dir), int(version), config_dir
            )
        else:
            folder = Path(state_or_path)
            if not (folder / "config.json").is_file():
                raise WeightSyncError(f"{folder} is not an HF checkpoint folder (no config.json)")
        written = time.perf_counter()
        await _all_or_raise(
            "update_weights_from_disk",
            clients,
            (client.update_weights_from_disk(str(folder), version) for client in clients),
        )
        loaded = time.perf_counter()
        removed = await asyncio.to_thread(remove_old_versions, Path(self.weights_dir), folder) if owned else []
        return {
            "method": "disk",
            "version": int(version),
            "servers": len(clients),
            "bytes": written_bytes,
            "write_s": written - started,
            "load_s": loaded - written,
            "cleanup_s": time.perf_counter() - loaded,
            "total_s": time.perf_counter() - started,
            "removed_versions": len(removed),
            "path": str(folder),
        }

    async def close(self) -> None:
        """Nothing held between pushes."""


LORA_FOLDER = re.compile(r"^lora-v(\d+)$")


def write_adapter_folder(
    adapter: Mapping[str, torch.Tensor], config: Mapping[str, Any], weights_dir: Path, version: int
) -> tuple[Path, int]:
    """Write the peft adapter folder `weights_dir/lora-v{version}` atomically (as `write_version_folder`)."""
    import json

    from safetensors.torch import save_file

    weights_dir.mkdir(parents=True, exist_ok=True)
    final = weights_dir / f"lora-v{version}"
    partial = weights_dir / f"{_PARTIAL_PREFIX}lora-v{version}-{uuid.uuid4().hex[:8]}"
    partial.mkdir()
    try:
        save_file(
            {k: v.detach().contiguous().cpu() for k, v in adapter.items()}, str(partial / "adapter_model.safetensors")
        )
        (partial / "adapter_config.json").write_text(json.dumps(dict(config), indent=1))
        _fsync_tree(partial)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    written = sum(item.stat().st_size for item in partial.iterdir() if item.is_file())
    if final.exists():
        shutil.rmtree(final)
    os.rename(partial, final)
    _fsync_dir(weights_dir)
    return final, written


def adapter_name(version: int) -> str:
    """The name an adapter version is loaded under: one per version, since SGLang refuses a name twice."""
    return f"rollhub-v{int(version)}"


@dataclass
class LoraAdapterSync:
    """Push a LoRA policy's adapter (`rollhub.trainer.lora.LoraWeights`) instead of merged weights.

    The adapter (a few MB where the model is GBs) is written as a peft folder `lora-v{version}` under
    `weights_dir`, every server loads it (`/load_lora_adapter`, under a name of its own per version),
    takes the version (`/update_weight_version`) and serves the next requests with it (the client
    sends `lora_path` = that name); then the previous adapter is unloaded and its folder removed.
    Servers must run with --enable-lora, --max-lora-rank >= model.lora.rank and --lora-target-modules
    covering model.lora.target_modules (`sglang_lora_args`). Pushing a version a server already holds
    (the router's retry over the replicas left) loads nothing again there.
    """

    weights_dir: str | Path
    method: Literal["lora_adapter"] = field(default="lora_adapter", init=False)

    def __post_init__(self) -> None:
        self.weights_dir = Path(self.weights_dir)

    async def push(self, clients: list[SGLangEngine], state_or_path: Any, version: int) -> dict[str, Any]:
        if not clients:
            raise WeightSyncError("no servers to push weights to")
        adapter = getattr(state_or_path, "adapter", None)
        if adapter is None:
            raise WeightSyncError(
                "engine.weight_sync=lora_adapter pushes a LoRA policy's adapter; this push holds none (set model.lora)"
            )
        started = time.perf_counter()
        name = adapter_name(version)
        folder, written = await asyncio.to_thread(
            write_adapter_folder, adapter, state_or_path.adapter_config, Path(self.weights_dir), int(version)
        )
        written_at = time.perf_counter()
        pending = [client for client in clients if client.lora_name != name]
        await _all_or_raise(
            "load_lora_adapter", pending, (client.load_lora_adapter(name, str(folder)) for client in pending)
        )
        await _all_or_raise(
            "update_weight_version", pending, (client.update_weight_version(int(version)) for client in pending)
        )
        previous = {client.lora_name for client in pending} - {None, name}
        for client in pending:
            client.lora_name, client.weight_version = name, int(version)
        for old in previous:  # no request runs on them any more (the router pushes while paused)
            results = await asyncio.gather(*(c.unload_lora_adapter(old) for c in pending), return_exceptions=True)
            for client, result in zip(pending, results):
                if isinstance(result, Exception):
                    logger.warning("%s: could not unload LoRA adapter %s: %s", client.url, old, result)
        removed = await asyncio.to_thread(_remove_old_adapters, Path(self.weights_dir), folder)
        return {
            "method": "lora_adapter",
            "version": int(version),
            "servers": len(clients),
            "bytes": written,
            "write_s": written_at - started,
            "load_s": time.perf_counter() - written_at,
            "total_s": time.perf_counter() - started,
            "removed_versions": len(removed),
            "path": str(folder),
        }

    async def close(self) -> None:
        """Nothing held between pushes."""


def _remove_old_adapters(weights_dir: Path, keep: Path) -> list[Path]:
    removed = []
    for item in weights_dir.iterdir():
        if item != keep and item.is_dir() and LORA_FOLDER.match(item.name):
            shutil.rmtree(item, ignore_errors=True)
            removed.append(item)
    return removed


def sglang_lora_args(rank: int, target_modules: Iterable[str]) -> list[str]:
    """The SGLang server flags an adapter of this rank and these target modules needs."""
    return ["--enable-lora", "--max-lora-rank", str(int(rank)), "--lora-target-modules", *sorted(target_modules)]


@dataclass
class DistributedWeightSync:
    """Push by broadcasting every tensor from rank 0 of a weight-update process group.

    The group is formed on the first push (`/init_weights_update_group` on every server, at
    offsets that leave each server one rank per tensor-parallel rank) and kept; a failed push
    closes it on this side and asks the servers to drop theirs, so the next push forms a fresh one.
    `master_address` must be reachable from every server (loopback when they run on this
    machine); port 0 picks a free one. `backend` "auto" is nccl when CUDA is available, else gloo; with nccl the tensors
    are copied to the GPU before each broadcast. Tensors are sent in buckets of about
    `bucket_bytes`, one `/update_weights_from_distributed` request per bucket, each bucket
    one broadcast of its bytes (`load_format` "flattened_bucket"; "per_tensor" sends one
    broadcast per tensor). `dtype` (the serving dtype, e.g. "bfloat16") casts every floating
    tensor before it is sent: the server casts on load anyway, and bf16 halves the bytes.
    Only the last bucket asks the server to flush its cache; every bucket carries the same
    version, so a server's label never runs ahead of the push. The buckets are sent inside a
    weight-update session (`/begin_weight_update` ... `/end_weight_update`) on releases that have
    one (SGLang 0.5.23 refuses them outside it), closed on a failed push too.
    """

    master_address: str = "127.0.0.1"
    master_port: int = 0
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    group_name: str = DEFAULT_GROUP_NAME
    timeout_s: float = 120.0
    bucket_bytes: int = 256 * 1024 * 1024
    load_format: Literal["flattened_bucket", "per_tensor"] = "flattened_bucket"
    dtype: str | None = None
    method: Literal["distributed"] = field(default="distributed", init=False)

    def __post_init__(self) -> None:
        if self.backend not in ("auto", "gloo", "nccl"):
            raise ValueError(f"backend must be auto, gloo or nccl, got {self.backend!r}")
        if not GROUP_NAME_PATTERN.match(self.group_name):
            raise ValueError(f"group_name must match {GROUP_NAME_PATTERN.pattern}, got {self.group_name!r}")
        if not 0 <= self.master_port <= 65535:
            raise ValueError(f"master_port must be in [0, 65535], got {self.master_port}")
        if not self.timeout_s > 0 or self.bucket_bytes < 1:
            raise ValueError("timeout_s and bucket_bytes must be positive")
        if self.load_format not in (FLATTENED_BUCKET, "per_tensor"):
            raise ValueError(f"load_format must be flattened_bucket or per_tensor, got {self.load_format!r}")
        if self.dtype is not None and self.dtype not in BROADCAST_DTYPES:
            raise ValueError(f"dtype must be one of {list(BROADCAST_DTYPES)} or None, got {self.dtype!r}")
        self._group: UpdateGroup | None = None
        self._members: tuple[str, ...] = ()

    def resolved_backend(self) -> str:
        if self.backend != "auto":
            return self.backend
        import torch

        return "nccl" if torch.cuda.is_available() else "gloo"

    async def _form_group(self, clients: list[SGLangEngine]) -> float:
        """Rank 0 here; a server of tp ranks joins at `rank_offset` and SGLang puts its tensor-parallel
        rank r at rank_offset + r, so each server's offset is 1 + the ranks of the servers before it.
        Returns the seconds it took."""
        started = time.perf_counter()
        backend = self.resolved_backend()
        check_master_address(self.master_address, [client.url for client in clients])
        sizes = await _all_or_raise("get_server_info", clients, (client.group_ranks() for client in clients))
        offsets = [1 + sum(sizes[:index]) for index in range(len(clients))]
        world_size = 1 + sum(sizes)
        store = await asyncio.to_thread(
            UpdateGroup.host_store, self.master_address, self.master_port, world_size, self.timeout_s
        )
        joining = asyncio.ensure_future(
            asyncio.to_thread(
                UpdateGroup.join,
                master_address=self.master_address,
                master_port=store.port,
                rank=0,
                world_size=world_size,
                group_name=self.group_name,
                backend=backend,
                timeout_s=self.timeout_s,
                store=store,
            )
        )
        try:
            await self._bounded(
                "init_weights_update_group",
                _all_or_raise(
                    "init_weights_update_group",
                    clients,
                    (
                        client.init_weights_update_group(
                            master_address=self.master_address,
                            master_port=store.port,
                            rank_offset=offsets[index],
                            world_size=world_size,
                            group_name=self.group_name,
                            backend=backend,
                        )
                        for index, client in enumerate(clients)
                    ),
                ),
            )
            self._group = await joining
        except BaseException:
            joining.add_done_callback(_close_quietly)  # it ends with the store's timeout
            await self._destroy_on(clients)  # servers that did join must not refuse the next init
            raise
        self._members = tuple(client.url for client in clients)
        return time.perf_counter() - started

    async def push(self, clients: list[SGLangEngine], state_or_path: Any, version: int) -> dict[str, Any]:
        """Broadcast `state_or_path` (a state dict, or an HF folder read here) to every server."""
        if not clients:
            raise WeightSyncError("no servers to push weights to")
        started = time.perf_counter()
        if isinstance(state_or_path, Mapping):
            state = state_or_path
        else:
            state = await asyncio.to_thread(read_checkpoint, state_or_path)
        group_s = 0.0
        if self._group is not None and self._members != tuple(client.url for client in clients):
            await self._drop_group(clients)  # the replica set changed: a new world size
        if self._group is None:
            group_s = await self._form_group(clients)
        # deduplicated and cast on a worker thread: a 7B state is seconds of copying, and the event
        # loop serves every episode's generation meanwhile
        tensors = await asyncio.to_thread(_push_tensors, state, self.dtype)
        group = self._group
        total_bytes = 0
        sending: asyncio.Future | None = None
        flattened = self.load_format == FLATTENED_BUCKET
        buckets = _buckets(tensors, self.bucket_bytes)
        in_session: list[SGLangEngine] = []
        try:
            in_session = await self._open_sessions(clients)
            for index, names in enumerate(buckets):
                bucket = [tensors[name] for name in names]
                total_bytes += sum(t.numel() * t.element_size() for t in bucket)
                sending = asyncio.ensure_future(asyncio.to_thread(_send_bucket, group, bucket, flattened))
                requests = _all_or_raise(
                    "update_weights_from_distributed",
                    clients,
                    (
                        client.update_weights_from_distributed(
                            names=names,
                            dtypes=[dtype_name(t.dtype) for t in bucket],
                            shapes=[list(t.shape) for t in bucket],
                            version=version,
                            group_name=self.group_name,
                            flush_cache=index == len(buckets) - 1,
                            load_format=FLATTENED_BUCKET if flattened else None,
                        )
                        for client in clients
                    ),
                )
                # shielded: a cancelled push must not forget the thread still inside a broadcast
                results = await asyncio.gather(
                    self._bounded("update_weights_from_distributed", requests),
                    asyncio.shield(sending),
                    return_exceptions=True,
                )
                errors = [r for r in results if isinstance(r, BaseException)]
                if errors:
                    raise (
                        errors[0]
                        if isinstance(errors[0], WeightSyncError)
                        else WeightSyncError(f"weight broadcast failed: {errors[0]!r}")
                    )
        except BaseException:
            await self._drop_group(clients, pending=sending)
            await self._close_sessions(in_session, quiet=True)
            raise
        await self._close_sessions(in_session)
        for client in clients:
            client.weight_version = int(version)
        return {
            "method": "distributed",
            "backend": group.backend_name,
            "version": int(version),
            "servers": len(clients),
            "bytes": total_bytes,
            "tensors": len(tensors),
            "buckets": len(buckets),
            "load_format": self.load_format,
            "group_s": group_s,
            "broadcast_s": time.perf_counter() - started - group_s,
            "total_s": time.perf_counter() - started,
        }

    async def _open_sessions(self, clients: list[SGLangEngine]) -> list[SGLangEngine]:
        """Open a weight-update session on every server whose release has them; the servers that
        did open one are returned even when another failed, so the caller closes exactly those."""
        results = await asyncio.gather(*(client.begin_weight_update() for client in clients), return_exceptions=True)
        opened = [client for client, result in zip(clients, results) if result is True]
        failures = [f"{c.url}: {r}" for c, r in zip(clients, results) if isinstance(r, Exception)]
        if failures:
            await self._close_sessions(opened, quiet=True)
            raise WeightSyncError(
                f"begin_weight_update failed on {len(failures)} of {len(clients)} servers: " + "; ".join(failures)
            )
        return opened

    async def _close_sessions(self, clients: list[SGLangEngine], *, quiet: bool = False) -> None:
        """End the sessions a push opened; after a failed push, best effort (the server may be gone)."""
        results = await asyncio.gather(*(client.end_weight_update() for client in clients), return_exceptions=True)
        failures = [f"{c.url}: {r}" for c, r in zip(clients, results) if isinstance(r, Exception)]
        if failures and not quiet:
            raise WeightSyncError(
                f"end_weight_update failed on {len(failures)} of {len(clients)} servers: " + "; ".join(failures)
            )

    async def _bounded(self, what: str, awaitable: Any) -> Any:
        """A server that stops answering (alive but wedged) fails the push instead of holding
        it for the HTTP client's hour: each step is bounded by twice the collective timeout."""
        try:
            return await asyncio.wait_for(awaitable, timeout=2 * self.timeout_s)
        except TimeoutError:
            raise WeightSyncError(f"{what}: no answer from the servers within {2 * self.timeout_s:.0f} s") from None

    async def _drop_group(self, clients: list[SGLangEngine], pending: asyncio.Future | None = None) -> None:
        """Close our side; ask the servers to drop theirs (best effort: they may be gone).

        Closing a group waits for a broadcast in flight, so with one still running (`pending`)
        the close is left to its end instead of blocking the event loop."""
        group, self._group, self._members = self._group, None, ()
        if group is not None:
            if pending is not None and not pending.done():
                pending.add_done_callback(lambda _: group.close())
            else:
                group.close()
        await self._destroy_on(clients)

    async def _destroy_on(self, clients: list[SGLangEngine]) -> None:
        results = await asyncio.gather(
            *(
                asyncio.wait_for(client.destroy_weights_update_group(self.group_name), DESTROY_TIMEOUT_S)
                for client in clients
            ),
            return_exceptions=True,
        )
        for client, result in zip(clients, results):
            if isinstance(result, Exception):
                logger.debug("destroy_weights_update_group on %s: %r", client.url, result)

    async def close(self, clients: list[SGLangEngine] | None = None) -> None:
        await self._drop_group(clients or [])


_LOOPBACK = ("127.", "localhost", "::1", "[::1]")


def check_master_address(master_address: str, urls: list[str]) -> None:
    """A loopback master address serves only servers on this machine: a server elsewhere would
    dial its own loopback and wait out the rendezvous timeout. Refused up front, with the fix."""
    import socket
    from urllib.parse import urlsplit

    if not master_address.startswith(_LOOPBACK):
        return
    local = {"0.0.0.0", socket.gethostname()}
    try:
        local |= {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None)}
    except OSError:
        pass
    for url in urls:
        host = urlsplit(url).hostname or ""
        if not host.startswith(_LOOPBACK) and host not in local:
            raise WeightSyncError(
                f"the weight update group's master address is {master_address}, which the server at {url} cannot "
                "reach; set engine.weight_sync_master_address to an address of this machine that it can"
            )


def _push_tensors(state: Mapping[str, torch.Tensor], dtype: str | None) -> dict[str, torch.Tensor]:
    """The tensors a push sends: one per storage, floating ones cast to the serving dtype."""
    tensors = unique_tensors(state)
    if dtype is None:
        return tensors
    import torch

    target = getattr(torch, dtype)
    return {n: t.to(target) if t.is_floating_point() else t for n, t in tensors.items()}


def _send_bucket(group: UpdateGroup, tensors: list[torch.Tensor], flattened: bool = False) -> None:
    if flattened:
        group.broadcast(flatten_bucket([t.detach().to(group.device) for t in tensors]))
        return
    for tensor in tensors:
        group.broadcast(tensor.detach().to(group.device).contiguous())


def _close_quietly(future: asyncio.Future) -> None:
    if not future.cancelled() and future.exception() is None:
        future.result().close()


WeightSync = DiskWeightSync | DistributedWeightSync | LoraAdapterSync


def build_weight_sync(method: str, *, weights_dir: str | Path | None = None, **options: Any) -> WeightSync:
    """A pusher by name: "disk" or "lora_adapter" (both need `weights_dir`), or "distributed" (options as
    in DistributedWeightSync)."""
    if method == "disk":
        if weights_dir is None:
            raise ValueError("the disk weight sync needs a weights_dir every server can read")
        return DiskWeightSync(weights_dir, config_dir=options.get("config_dir"))
    if method == "distributed":
        return DistributedWeightSync(**options)
    if method == "lora_adapter":
        if weights_dir is None:
            raise ValueError("the LoRA adapter sync needs a weights_dir every server can read")
        return LoraAdapterSync(weights_dir)
    raise ValueError(f"weight sync method must be 'disk', 'distributed' or 'lora_adapter', got {method!r}")


NcclVersion = tuple[int, ...]

#: what a server interpreter is asked: its torch's NCCL version, or nothing for a build without one
_NCCL_PROBE = (
    "import torch\n"
    "try:\n    v = torch.cuda.nccl.version()\nexcept Exception:\n    v = None\n"
    "print('.'.join(map(str, v)) if isinstance(v, tuple) else (v or ''))"
)


def local_nccl_version() -> NcclVersion | None:
    """The NCCL this process's torch links, or None for a build without one (CPU wheels)."""
    import torch

    try:
        version = torch.cuda.nccl.version()
    except Exception:  # CPU builds have no NCCL bindings
        return None
    return version if isinstance(version, tuple) else None


def nccl_version_of(python: str, timeout_s: float = 60.0) -> NcclVersion | None:
    """The NCCL of another interpreter's torch (a server venv), asked in a subprocess; None when it
    has none, no torch, or does not answer. Each torch wheel pins its own NCCL, and NCCL refuses a
    peer of another version, so a group across two venvs forms only when these agree."""
    import subprocess

    try:
        out = subprocess.run([python, "-c", _NCCL_PROBE], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = out.stdout.strip().splitlines()[-1] if out.returncode == 0 and out.stdout.strip() else ""
    if not re.fullmatch(r"\d+(\.\d+)*", text):
        return None
    parts = tuple(int(p) for p in text.split("."))
    if len(parts) == 1 and parts[0] >= 10000:  # older torch: one integer, major * 10000 + minor * 100 + patch
        parts = (parts[0] // 10000, parts[0] // 100 % 100, parts[0] % 100)
    return parts


def choose_update_backend(
    requested: str, *, shared_gpu: bool, trainer_nccl: NcclVersion | None, server_nccl: NcclVersion | None
) -> tuple[str, str | None]:
    """The update group's backend for `engine.weight_sync_backend` = `requested`, and the reason when
    `auto` falls back to gloo. NCCL needs one rank per GPU (no server on the trainer's GPU) and the
    same NCCL version on both sides; an explicit nccl that cannot form is a UserError naming why."""
    from rollhub.core.errors import UserError

    if requested == "gloo":
        return "gloo", None
    if shared_gpu:
        why = "a server shares the trainer's GPU and NCCL refuses two ranks on one GPU"
    elif trainer_nccl is None or server_nccl is None:
        side = "the trainer's torch" if trainer_nccl is None else "the server's interpreter"
        why = f"{side} has no NCCL"
    elif trainer_nccl != server_nccl:
        show = ".".join
        why = (
            f"the trainer's NCCL {show(map(str, trainer_nccl))} and the server's "
            f"{show(map(str, server_nccl))} differ, and NCCL refuses peers of another version"
        )
    else:
        return "nccl", None
    if requested == "nccl":
        raise UserError(
            f"engine.weight_sync_backend=nccl cannot form a group: {why}; use engine.weight_sync_backend=gloo "
            "(or auto), engine.weight_sync=disk, or a server_python whose torch links the trainer's NCCL"
        )
    return "gloo", f"weight pushes use gloo: {why}"
