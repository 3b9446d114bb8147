"""Images of the task factory: one per package, plus a tiny layer per task.

Package image (`rollhub/swe-pkg-<name>-<version>:<content hash>`): the offline base
`rollhub/base:bookworm`, a venv with the test dependencies installed from host-downloaded
wheels with the network off, the repo at /testbed made importable by a `.pth` file.

Instance image (`rollhub/sweb.eval.x86_64.<id>:latest`, the swebench 5.x naming with
`__` -> `_1776_`): the package image with the bug applied and the git history squashed
to one commit with a fixed identity and date, so `git log` shows nothing and the hash is
reproducible (`build-images` checks it against the row's base_commit).
"""

from __future__ import annotations

import logging
import shlex
from typing import Any

from rollhub.envs.swe.package_repo import GIT_ENV, PackageRepo, normalize_name
from rollhub.envs.swe.tasks import WORKDIR
from rollhub.sandbox.base import Limits, SandboxBackend, SandboxError

logger = logging.getLogger(__name__)

IMAGE_NAMESPACE = "rollhub"
_SQUASH = (
    "rm -rf .git && git -c init.defaultBranch=main init -q && git add -A . && "
    "git -c commit.gpgsign=false commit -q -m 'Initial commit' && git rev-parse HEAD"
)


#: SIGKILL as stop signal: harnesses that `docker stop` a container whose PID 1 ignores
#: SIGTERM (the official one runs `tail -f /dev/null`) would otherwise wait 15 s each time
_INSTANCE_CONFIG = {"Cmd": ["sleep", "infinity"], "StopSignal": "SIGKILL", "WorkingDir": WORKDIR}


def instance_image_name(instance_id: str, namespace: str = IMAGE_NAMESPACE) -> str:
    key = f"sweb.eval.x86_64.{instance_id}:latest".lower().replace("__", "_1776_")
    return f"{namespace}/{key}"


def build_package_image(client: Any, repo: PackageRepo) -> str:
    """Base + venv (wheels, no network) + repo at /testbed; cached by content hash."""
    from rollhub.sandbox.images import build_python_image

    import_path = f"{WORKDIR}/{repo.import_root}" if repo.import_root else WORKDIR
    run = [
        f"echo {import_path} > $(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')/rollhub_testbed.pth",
        "git config --system --add safe.directory '*'",
        f"cd {WORKDIR} && git status --short | head -5",
    ]
    return build_python_image(client, repo.requirements, f"{IMAGE_NAMESPACE}/swe-pkg-{normalize_name(repo.name)}-{repo.version}", files={WORKDIR: str(repo.root)}, run=run)


async def build_instance_image(backend: SandboxBackend, client: Any, package_image: str, instance_id: str, bug_patch: str) -> tuple[str, str]:
    """Apply `bug_patch` in a container of the package image, squash history, commit.

    Returns (image tag, base_commit)."""
    tag = instance_image_name(instance_id)
    async with await backend.start(package_image, Limits(cpus=1.0, memory_mb=1024), labels={"rollhub.role": "swe-build"}) as box:
        await box.write_file("/tmp/bug.diff", bug_patch)
        applied = await box.exec("git apply /tmp/bug.diff && rm /tmp/bug.diff", timeout_s=60, workdir=WORKDIR)
        if applied.exit_code != 0:
            raise SandboxError(f"the bug patch of {instance_id} does not apply to {package_image}: {applied.output[-500:]}")
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in GIT_ENV.items())
        squashed = await box.exec(f"export {exports}; {_SQUASH}", timeout_s=60, workdir=WORKDIR)
        if squashed.exit_code != 0:
            raise SandboxError(f"squashing the history of {instance_id} failed: {squashed.output[-500:]}")
        base_commit = squashed.output.strip().splitlines()[-1]
        repository, _, image_tag = tag.rpartition(":")
        client.api.commit(box.id, repository=repository, tag=image_tag, message=f"rollhub swe task {instance_id}", conf=_INSTANCE_CONFIG | {"Labels": {"rollhub.swe.instance": instance_id}})
    return tag, base_commit
