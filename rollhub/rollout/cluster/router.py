"""Moved: the router is used without Ray too (the `server` engine backend), so it lives in
`rollhub.inference.engines.router`; this name stays for existing imports."""

from rollhub.inference.engines.router import EngineRouter, ReplicaError, RouterStats, affinity_key, group_key

__all__ = ["EngineRouter", "ReplicaError", "RouterStats", "affinity_key", "group_key"]
