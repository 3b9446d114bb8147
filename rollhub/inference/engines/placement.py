"""Where the in-process engine runs: one explicit device and dtype, checked up front.

An engine that quietly fell back to the CPU (no CUDA) or kept a model on another device
than the one asked for would still produce tokens, only slower or in another precision, and
nobody would notice until the numbers were wrong. So the device is named, the dtype follows
from it unless given (bf16 on CUDA, fp32 on the CPU), and a mismatch is a clear error.
"""

from __future__ import annotations

from typing import Any

import torch

from rollhub.core.errors import UserError

_DTYPE_NAMES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}


def resolve_device(device: str | torch.device) -> torch.device:
    """`device` as a torch.device; a CUDA device that this machine lacks is a UserError."""
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise UserError(f"engine device {device!r} is not a device name; use 'cpu', 'cuda' or 'cuda:N'") from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"engine device {device!r} asked for, but no CUDA device is available; use device='cpu'")
        count = torch.cuda.device_count()
        if resolved.index is not None and resolved.index >= count:
            raise UserError(f"engine device {device!r} asked for, but this machine has {count} CUDA device(s)")
    elif resolved.type != "cpu":
        raise UserError(f"engine device {device!r} is not supported; use 'cpu' or 'cuda[:N]'")
    return resolved


def resolve_dtype(dtype: torch.dtype | str | None, device: torch.device) -> torch.dtype:
    """`dtype` as a torch.dtype; None means bf16 on CUDA and fp32 on the CPU."""
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        if not dtype.is_floating_point:
            raise UserError(f"engine dtype must be a floating-point type, not {dtype}")
        return dtype
    if isinstance(dtype, str):
        name = dtype.lower().removeprefix("torch.")
        if name in _DTYPE_NAMES:
            return _DTYPE_NAMES[name]
    raise UserError(f"engine dtype {dtype!r} is not known; use one of {sorted(set(_DTYPE_NAMES))}")


def check_model_placement(model: Any, device: torch.device, dtype: torch.dtype | None) -> None:
    """A model handed in loaded must already sit on `device` (and in `dtype` when one was given).

    The engine never moves a caller's model: `.to()` is in place, so it would silently move
    the caller's (e.g. the trainer's) copy too.
    """
    parameter = next(model.parameters(), None)
    if parameter is None:
        raise UserError("the engine's model has no parameters")
    where = parameter.device
    same_device = where.type == device.type and (device.index is None or where.index == device.index)
    if not same_device:
        raise UserError(
            f"the model passed to the engine is on {where}, but the engine was asked to run on {device}; "
            f"move the model first (model.to('{device}')) or pass device='{where}'"
        )
    if dtype is not None and parameter.dtype != dtype:
        raise UserError(
            f"the model passed to the engine is {parameter.dtype}, but dtype={dtype} was asked for; "
            f"convert the model first (model.to({dtype})) or leave dtype unset"
        )
