"""Images of the task factory: one per package, plus a tiny layer per task.

Package image (`rollhub/swe-pkg-<name>-<version>:<content hash>`): the offline base
`rollhub/base:bookworm`, a venv with the test dependencies installed from host-downloaded
wheels with the network off, the repo at /testbed made importable by a `.pth` file.

Instance image (`rollhub/sweb.eval.x86_64.<id>:latest`, the swebench 5.x naming with
`__` -> `_1776_`): the package image with the bug applied and the git history squashed
to one commit with a fixed identity and date, so `git log` shows nothing and the hash is
reproducible (`build-images` checks it against the row's base_commit).

Both declare the non-root sandbox user `agent` (uid 1000, the `rollhub.sandbox.user` label):
it owns /testbed, so the agent edits the repository and runs its tests, while the
interpreter, the venv's site-packages and the system stay root's and read-only to it. The
image's default user stays root, as the official harness expects. The tag of an instance
image is fixed by the swebench naming, so the `rollhub.swe.image_format` label tells an
image of this recipe from an older one built under the same tag (`instance_image_current`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import shlex
import tempfile
from pathlib import Path
from typing import Any

from rollhub.envs.swe.factory.package_repo import GIT_ENV, PackageRepo, normalize_name
from rollhub.envs.swe.tasks import WORKDIR
from rollhub.sandbox.base import SandboxError
from rollhub.sandbox.images import LABEL_SANDBOX_USER

logger = logging.getLogger(__name__)

IMAGE_NAMESPACE = "rollhub"
#: who the agent's commands (and the tests at grading) run as; owns /testbed
SWE_USER = "agent"
#: raised when the recipe changes what an image holds, so `build-images` rebuilds the fixed tags
IMAGE_FORMAT = "2"
LABEL_IMAGE_FORMAT = "rollhub.swe.image_format"
_SQUASH = (
    "rm -rf .git && git -c init.defaultBranch=main init -q && git add -A . && "
    "git -c commit.gpgsign=false commit -q -m 'Initial commit' && git rev-parse HEAD"
)


#: STOPSIGNAL SIGKILL: harnesses that `docker stop` a container whose PID 1 ignores SIGTERM
#: (the official one runs `tail -f /dev/null`) would otherwise wait 15 s each time
_COMMIT_MARKER = "ROLLHUB_BASE_COMMIT="


def instance_image_name(instance_id: str, namespace: str = IMAGE_NAMESPACE) -> str:
    key = f"sweb.eval.x86_64.{instance_id}:latest".lower().replace("__", "_1776_")
    return f"{namespace}/{key}"


def instance_image_current(client: Any, tag: str) -> bool:
    """Whether `tag` exists and was built by this recipe (an older image under the same tag,
    e.g. one whose commands ran as root, must be rebuilt, not reused)."""
    import docker.errors

    try:
        labels = client.images.get(tag).labels or {}
    except docker.errors.ImageNotFound:
        return False
    return labels.get(LABEL_IMAGE_FORMAT) == IMAGE_FORMAT and labels.get(LABEL_SANDBOX_USER) == SWE_USER


def build_package_image(client: Any, repo: PackageRepo) -> str:
    """Base + venv (wheels, no network) + repo at /testbed owned by the sandbox user; cached
    by content hash."""
    from rollhub.sandbox.images import build_python_image

    import_path = f"{WORKDIR}/{repo.import_root}" if repo.import_root else WORKDIR
    run = [
        (
            f"echo {import_path} > "
            "$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')"
            "/rollhub_testbed.pth"
        ),
        "git config --system --add safe.directory '*'",
        f"cd {WORKDIR} && git status --short | head -5",
    ]
    return build_python_image(
        client,
        repo.requirements,
        f"{IMAGE_NAMESPACE}/swe-pkg-{normalize_name(repo.name)}-{repo.version}",
        files={WORKDIR: str(repo.root)},
        run=run,
        sandbox_user=SWE_USER,
        user_owned=[WORKDIR],
    )


def _build_instance_blocking(client: Any, package_image: str, instance_id: str, bug_patch: str) -> tuple[str, str]:
    import docker.errors

    tag = instance_image_name(instance_id)
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in GIT_ENV.items())
    dockerfile = "\n".join(
        [
            f"FROM {package_image}",
            "COPY bug.diff /tmp/bug.diff",
            f"RUN cd {WORKDIR} && git apply /tmp/bug.diff && rm /tmp/bug.diff && export {exports} && "
            f"echo {_COMMIT_MARKER}$({_SQUASH}) && "
            # what git wrote as root goes back to the sandbox user; files it already owns are
            # left alone (a chown would copy each of them into this layer)
            f"find {WORKDIR} ! -user {SWE_USER} -exec chown -h {SWE_USER}:{SWE_USER} {{}} +",
            f"LABEL rollhub.swe.instance={json.dumps(instance_id)}",
            f'LABEL {LABEL_IMAGE_FORMAT}="{IMAGE_FORMAT}"',
            "STOPSIGNAL SIGKILL",
            f"WORKDIR {WORKDIR}",
            'CMD ["sleep", "infinity"]',
        ]
    )
    with tempfile.TemporaryDirectory(prefix="rollhub-swe-task-") as context:
        Path(context, "Dockerfile").write_text(dockerfile + "\n")
        Path(context, "bug.diff").write_text(bug_patch)
        try:
            # nocache: a cached RUN step prints nothing, and its output carries the commit hash (a rerun of
            # make-tasks after an interrupted one rebuilds the same layer; the hash is reproducible)
            _, log = client.images.build(
                path=context, tag=tag, network_mode="none", pull=False, rm=True, forcerm=True, nocache=True
            )
        except docker.errors.BuildError as exc:
            text = "".join(str(e.get("stream", e.get("error", ""))) for e in exc.build_log)[-1500:]
            raise SandboxError(f"building the image of {instance_id} on {package_image} failed: {text}") from exc
    text = "".join(str(entry.get("stream", "")) for entry in log)
    match = re.search(rf"^{_COMMIT_MARKER}([0-9a-f]{{40}})$", text, flags=re.M)
    if not match:
        raise SandboxError(f"building {tag}: no commit hash in the build log:\n{text[-1000:]}")
    return tag, match.group(1)


async def build_instance_image(client: Any, package_image: str, instance_id: str, bug_patch: str) -> tuple[str, str]:
    """The package image + the bug + a squashed one-commit history, built with the network off
    (a build, not `docker commit`, so no container labels leak into the image).

    Returns (image tag, base_commit)."""
    return await asyncio.to_thread(_build_instance_blocking, client, package_image, instance_id, bug_patch)
