"""Trajectories and groups to/from JSON-safe dicts (JSONL logs, buffer checkpoints).

Anchors are hashable keys of any shape (bytes, tuples, strings); they are tagged so they
come back with the same type and hash, which GiGPO's step grouping depends on.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rollhub.rollout.types import Group, Trajectory, TrajectoryStatus, Turn


def encode_value(value: Any) -> Any:
    """A JSON-safe form of `value` that `decode_value` turns back into an equal, same-type value."""
    if isinstance(value, bytes):
        return {"__bytes__": value.hex()}
    if isinstance(value, tuple):
        return {"__tuple__": [encode_value(v) for v in value]}
    if isinstance(value, frozenset):
        return {"__frozenset__": [encode_value(v) for v in sorted(value, key=repr)]}
    if isinstance(value, list):
        return [encode_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): encode_value(v) for k, v in value.items()}
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "item"):  # numpy / torch scalars
        return value.item()
    return repr(value)


def decode_value(value: Any) -> Any:
    if isinstance(value, dict):
        if "__bytes__" in value and len(value) == 1:
            return bytes.fromhex(value["__bytes__"])
        if "__tuple__" in value and len(value) == 1:
            return tuple(decode_value(v) for v in value["__tuple__"])
        if "__frozenset__" in value and len(value) == 1:
            return frozenset(decode_value(v) for v in value["__frozenset__"])
        return {k: decode_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decode_value(v) for v in value]
    return value


def trajectory_to_dict(trajectory: Trajectory) -> dict[str, Any]:
    data = dataclasses.asdict(trajectory)
    data["status"] = trajectory.status.value
    for turn, source in zip(data["turns"], trajectory.turns):
        turn["anchor"] = encode_value(source.anchor)
    data["info"] = encode_value(trajectory.info)
    data["total_reward"] = trajectory.total_reward
    data["num_response_tokens"] = trajectory.num_response_tokens
    return data


def trajectory_from_dict(data: dict[str, Any]) -> Trajectory:
    fields = {f.name for f in dataclasses.fields(Trajectory)}
    turn_fields = {f.name for f in dataclasses.fields(Turn)}
    turns = [
        Turn(**{k: (decode_value(v) if k == "anchor" else v) for k, v in t.items() if k in turn_fields})
        for t in data.get("turns", [])
    ]
    kwargs = {k: v for k, v in data.items() if k in fields and k != "turns"}
    kwargs["status"] = TrajectoryStatus(kwargs.get("status", "completed"))
    kwargs["info"] = decode_value(kwargs.get("info", {}))
    return Trajectory(turns=turns, **kwargs)


def group_to_dict(group: Group) -> dict[str, Any]:
    return {
        "group_id": group.group_id,
        "env_id": group.env_id,
        "seed": group.seed,
        "created_version": group.created_version,
        "trajectories": [trajectory_to_dict(t) for t in group.trajectories],
    }


def group_from_dict(data: dict[str, Any]) -> Group:
    return Group(
        group_id=data["group_id"],
        env_id=data["env_id"],
        seed=data["seed"],
        created_version=data.get("created_version", 0),
        trajectories=[trajectory_from_dict(t) for t in data["trajectories"]],
    )
