"""Finding and force-removing rollhub containers: a run's own at exit, orphans for `gc`.

Removal is always `rm -f` (SIGKILL + delete): a graceful stop waits up to 10-15 s per
container for a PID 1 that may ignore SIGTERM, and we never need the container's state.
"""

from __future__ import annotations

import collections
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from rollhub.sandbox import ownership

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ContainerRecord:
    id: str
    name: str
    image: str
    state: str
    run_id: str
    owner: ownership.OwnerStatus
    labels: dict[str, str]

    @property
    def owner_alive(self) -> bool:
        """False only when the owner is provably dead in this host + PID namespace."""
        return self.owner.state != ownership.DEAD


@dataclass
class GcReport:
    """What `gc` did: removed containers, and the ones it left alone grouped by reason."""

    removed: list[ContainerRecord] = field(default_factory=list)  # selected and force-removed
    failed: int = 0  # of `removed`, how many the engine refused (a later gc retries them)
    skipped: dict[str, list[ContainerRecord]] = field(default_factory=dict)

    def skipped_count(self) -> int:
        return sum(len(records) for records in self.skipped.values())


def list_rollhub_containers(api: Any, run_id: str | None = None) -> list[ContainerRecord]:
    """Every container (running or not) carrying the rollhub run label, optionally of one run."""
    label = f"{ownership.LABEL_RUN}={run_id}" if run_id else ownership.LABEL_RUN
    records = []
    for raw in api.containers(all=True, filters={"label": label}):
        labels = raw.get("Labels") or {}
        records.append(
            ContainerRecord(
                id=raw["Id"],
                name=(raw.get("Names") or ["?"])[0].lstrip("/"),
                image=raw.get("Image", "?"),
                state=raw.get("State", "?"),
                run_id=labels.get(ownership.LABEL_RUN, ""),
                owner=ownership.owner_status(labels),
                labels=labels,
            )
        )
    return records


def remove_containers(api: Any, container_ids: list[str], parallelism: int = 8) -> int:
    """Force-remove containers, a few at a time (dockerd serialises much of this anyway).
    Returns how many were removed; already-gone containers count as removed."""
    import docker

    def remove_one(container_id: str) -> bool:
        try:
            api.remove_container(container_id, force=True, v=True)
            return True
        except docker.errors.NotFound:
            return True
        except docker.errors.APIError as exc:
            if "already in progress" in str(exc):
                return True
            logger.warning("could not remove container %s: %s", container_id[:12], exc)
            return False
        except Exception as exc:  # engine unreachable: gc removes it once the engine is back
            logger.warning(
                "could not remove container %s (%s: %s); run `rollhub sandbox gc` later",
                container_id[:12],
                exc.__class__.__name__,
                exc,
            )
            return False

    if not container_ids:
        return 0
    if len(container_ids) == 1 or parallelism <= 1:
        return sum(map(remove_one, container_ids))
    try:
        with ThreadPoolExecutor(max_workers=min(parallelism, len(container_ids))) as pool:
            return sum(pool.map(remove_one, container_ids))
    except RuntimeError:  # at interpreter exit no new pool threads may start: go one by one
        return sum(map(remove_one, container_ids))


def remove_run(api: Any, run_id: str) -> int:
    """Remove every container of one run (the run's exit cleanup). Logs, and returns 0,
    when the engine cannot be reached."""
    try:
        records = list_rollhub_containers(api, run_id)
    except Exception as exc:
        logger.warning(
            "could not list the containers of run %s (%s: %s); run `rollhub sandbox gc` later",
            run_id,
            exc.__class__.__name__,
            exc,
        )
        return 0
    return remove_containers(api, [record.id for record in records])


def _skip_reason(record: ContainerRecord) -> str:
    if record.owner.state == ownership.ALIVE:
        return "owner alive"
    return record.owner.reason


def sweep(api: Any, remove_all: bool = False, run_id: str | None = None) -> GcReport:
    """Remove containers whose owner is provably dead in this host + PID namespace (every
    rollhub container with `remove_all`), optionally of one run only.

    Foreign owners (another host sharing the engine, another PID namespace, labels too old
    to tell) are skipped and reported: their pid says nothing here, so a pid we cannot see
    is no proof of death.
    """
    report = GcReport()
    skipped: dict[str, list[ContainerRecord]] = collections.defaultdict(list)
    for record in list_rollhub_containers(api, run_id):
        if remove_all or record.owner.state == ownership.DEAD:
            report.removed.append(record)
        else:
            skipped[_skip_reason(record)].append(record)
    report.skipped = dict(skipped)
    removed = remove_containers(api, [record.id for record in report.removed])
    report.failed = len(report.removed) - removed
    return report


def collect_garbage(api: Any, remove_all: bool = False) -> list[ContainerRecord]:
    """`sweep` for callers that only need the removed records (backend start, Ray shards)."""
    return sweep(api, remove_all=remove_all).removed
