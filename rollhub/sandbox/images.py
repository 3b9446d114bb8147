"""Container images built without any registry.

- `build_base_image()`: `rollhub/base:bookworm` from a debootstrap (minbase) of Debian
  bookworm plus python3, python3-venv, git, patch and ca-certificates, turned into an image
  with `docker import`. debootstrap fetches .debs from the Debian mirror (a package
  registry); no image is pulled from Docker Hub.
- `build_layered_image()`: a base plus local files plus RUN steps, built by the legacy
  builder from a generated Dockerfile with the network off, tagged by a content hash, and
  reused when that tag already exists.
- `download_wheels()` + `python_venv_steps()`: Python dependencies come in as wheels
  downloaded on the host (`pip download`) and are installed inside with `--no-index`,
  because HTTPS from inside containers does not work on these machines.

Nothing here runs during a training run: images are built up front, and sandboxes refuse
to start from a missing image rather than pull it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from rollhub.sandbox.base import SandboxError

logger = logging.getLogger(__name__)

BASE_IMAGE = "rollhub/base:bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "git", "patch", "ca-certificates")
DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEB_CACHE_DIR = "/var/cache/rollhub/debootstrap-debs"
LABEL_CONTENT_HASH = "rollhub.content_hash"
#: The non-root user sandboxes run commands as (`Limits(user="auto")` in docker_backend).
LABEL_SANDBOX_USER = "rollhub.sandbox.user"
# No bytecode in images (smaller, reproducible layers) and a fixed git identity for commits
# made inside sandboxes.
BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "GIT_AUTHOR_NAME": "rollhub",
    "GIT_AUTHOR_EMAIL": "rollhub@localhost",
    "GIT_COMMITTER_NAME": "rollhub",
    "GIT_COMMITTER_EMAIL": "rollhub@localhost",
}


def image_exists(client: Any, tag: str) -> bool:
    import docker.errors

    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def _run(argv: list[str], what: str) -> None:
    logger.info("%s: %s", what, " ".join(argv))
    completed = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if completed.returncode != 0:
        tail = completed.stdout[-3000:]
        raise SandboxError(f"{what} failed (exit {completed.returncode}):\n{tail}")


def build_base_image(
    client: Any,
    tag: str = BASE_IMAGE,
    *,
    mirror: str = DEBIAN_MIRROR,
    suite: str = "bookworm",
    packages: tuple[str, ...] = BASE_PACKAGES,
    force: bool = False,
    work_dir: str | None = None,
) -> str:
    """Build the base image with debootstrap + `docker import`; a no-op when `tag` exists
    (unless `force`). Needs root and the `debootstrap` command (apt-get install debootstrap)."""
    if not force and image_exists(client, tag):
        logger.info("base image %s already present", tag)
        return tag
    if shutil.which("debootstrap") is None:
        raise SandboxError("debootstrap is not installed: apt-get install -y debootstrap")
    if os.geteuid() != 0:
        raise SandboxError("building the base image needs root (debootstrap creates device nodes and chowns files)")
    os.makedirs(DEB_CACHE_DIR, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rollhub-base-", dir=work_dir or "/var/tmp") as scratch:
        rootfs = os.path.join(scratch, "rootfs")
        _run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(packages)}",
                f"--cache-dir={DEB_CACHE_DIR}",
                suite,
                rootfs,
                mirror,
            ],
            "debootstrap",
        )
        _trim_rootfs(rootfs)
        archive = os.path.join(scratch, "rootfs.tar")
        _run(["tar", "--numeric-owner", "-C", rootfs, "-cf", archive, "."], "tar rootfs")
        changes = [f"ENV {key}={value}" for key, value in BASE_ENV.items()]
        changes += [f'LABEL {LABEL_CONTENT_HASH}="{suite}:{",".join(packages)}"', 'CMD ["bash"]']
        repository, _, version = tag.partition(":")
        client.api.import_image_from_file(archive, repository=repository, tag=version or "latest", changes=changes)
    if not image_exists(client, tag):
        raise SandboxError(f"docker import finished but {tag} is not listed")
    logger.info("built %s", tag)
    return tag


def _trim_rootfs(rootfs: str) -> None:
    """Drop package caches and docs the sandbox never needs (about a third of the size)."""
    for relative in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/info"):
        target = os.path.join(rootfs, relative)
        if os.path.isdir(target):
            for entry in os.listdir(target):
                path = os.path.join(target, entry)
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, ignore_errors=True)
                elif entry != "lock":
                    os.unlink(path)


# ---------------------------------------------------------------------- layered images
def _hash_path(digest: hashlib._Hash, path: Path) -> None:
    """Feed a file's or a directory tree's names, modes and bytes into `digest`."""
    if path.is_file():
        digest.update(b"F" + oct(path.stat().st_mode & 0o777).encode())
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        return
    if not path.is_dir():
        raise FileNotFoundError(f"image input does not exist: {path}")
    for child in sorted(path.rglob("*")):
        if child.is_file():
            digest.update(b"\0" + str(child.relative_to(path)).encode() + b"\0")
            _hash_path(digest, child)


def layered_image_hash(
    base_id: str,
    files: dict[str, str],
    run: list[str],
    env: dict[str, str],
    workdir: str | None,
    sandbox_user: str | None = None,
    user_owned: list[str] | None = None,
) -> str:
    """The content hash that names a layered image: base image id, every input file's
    destination and bytes, the RUN steps, env, workdir and the sandbox user."""
    digest = hashlib.sha256()
    recipe: dict[str, object] = {"base": base_id, "run": run, "env": env, "workdir": workdir}
    if sandbox_user:  # absent otherwise, so existing images keep their tags
        recipe["sandbox_user"] = [sandbox_user, sorted(user_owned or [])]
    digest.update(json.dumps(recipe, sort_keys=True).encode())
    for dest in sorted(files):
        digest.update(b"\1" + dest.encode() + b"\1")
        _hash_path(digest, Path(files[dest]))
    return digest.hexdigest()


def build_layered_image(
    client: Any,
    base: str,
    files: dict[str, str],
    run: list[str],
    tag_prefix: str,
    *,
    env: dict[str, str] | None = None,
    workdir: str | None = None,
    sandbox_user: str | None = None,
    user_owned: list[str] | None = None,
) -> str:
    """Build `base` + files + RUN steps with the network off; returns `tag_prefix:<hash16>`.

    `files` maps a destination path in the image to a local file or directory. The tag is a
    content hash of all inputs (including the base image's id), so an unchanged request
    reuses the existing image instantly and a changed one never collides with it.

    `sandbox_user` (a user name): the image gets that user (uid 1000 when it must be
    created), `user_owned` folders (default: `workdir`) are chowned to it after the RUN
    steps, and the `rollhub.sandbox.user` label makes sandboxes run commands as it
    (`Limits(user="auto")`). Images built FROM this one inherit the label: a later step that
    writes into those folders as root must chown them again.
    """
    import docker.errors

    env = dict(env or {})
    try:
        base_id = client.images.get(base).id
    except docker.errors.ImageNotFound as exc:
        raise SandboxError(
            f"base image {base!r} is missing; build it first (`rollhub sandbox build-base` for {BASE_IMAGE})"
        ) from exc
    for dest in files:
        if not dest.startswith("/"):
            raise ValueError(f"image destinations must be absolute, got {dest!r}")
    if sandbox_user is not None and not re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}", sandbox_user):
        raise ValueError(f"sandbox_user must be a plain user name, got {sandbox_user!r}")
    owned = list(user_owned if user_owned is not None else ([workdir] if workdir else []))
    for folder in owned:
        if not folder.startswith("/"):
            raise ValueError(f"user_owned folders must be absolute, got {folder!r}")
    content_hash = layered_image_hash(base_id, files, run, env, workdir, sandbox_user, owned)
    tag = f"{tag_prefix}:{content_hash[:16]}"
    if image_exists(client, tag):
        logger.info("reusing %s", tag)
        return tag
    with tempfile.TemporaryDirectory(prefix="rollhub-image-") as context:
        lines = [f"FROM {base}"]
        if sandbox_user:
            lines.append(
                f"RUN id -u {sandbox_user} >/dev/null 2>&1 || "
                f"useradd --uid 1000 --user-group --create-home --shell /bin/bash {sandbox_user}"
            )
        for index, dest in enumerate(sorted(files)):
            source = Path(files[dest])
            staged = Path(context, "inputs", str(index))
            if source.is_dir():
                shutil.copytree(source, staged, symlinks=True)
            else:
                staged.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, staged)
            lines.append(f"COPY {json.dumps([f'inputs/{index}', dest])}")  # JSON form: any dest path
        for key, value in sorted(env.items()):
            lines.append(f"ENV {key}={json.dumps(value)}")
        if workdir:
            lines.append(f"WORKDIR {workdir}")
        lines += [f"RUN {step}" for step in run]
        if sandbox_user:
            if owned:
                folders = " ".join(shlex.quote(folder) for folder in owned)
                lines.append(f"RUN mkdir -p {folders} && chown -R {sandbox_user}: {folders}")
            lines.append(f'LABEL {LABEL_SANDBOX_USER}="{sandbox_user}"')
        lines.append(f'LABEL {LABEL_CONTENT_HASH}="{content_hash}"')
        Path(context, "Dockerfile").write_text("\n".join(lines) + "\n")
        try:
            client.images.build(path=context, tag=tag, network_mode="none", pull=False, rm=True, forcerm=True)
        except docker.errors.BuildError as exc:
            log = "".join(str(entry.get("stream", entry.get("error", ""))) for entry in exc.build_log)[-3000:]
            raise SandboxError(f"building {tag} failed: {exc.msg}\n{log}") from exc
    logger.info("built %s", tag)
    return tag


# ---------------------------------------------------------------------- Python deps
def download_wheels(requirements: list[str], dest: str, *, extra_args: list[str] | None = None) -> str:
    """`pip download` wheels for `requirements` (and pip itself, to install them inside)
    into `dest` on the host. Binary-only, for the base image's Python (3.11)."""
    os.makedirs(dest, exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--dest",
        dest,
        "--only-binary=:all:",
        "--python-version",
        "3.11",
        "pip",
        *requirements,
    ]
    _run(argv + list(extra_args or []), "pip download")
    return dest


def python_venv_steps(wheelhouse: str, packages: list[str], venv: str = "/opt/venv") -> list[str]:
    """RUN steps that create `venv` and install `packages` from the wheelhouse copied to
    `wheelhouse` in the image, with no index (pip runs straight from its own wheel)."""
    quoted = " ".join(json.dumps(package) for package in packages)
    return [
        f"python3 -m venv --without-pip {venv}",
        (
            f"{venv}/bin/python $(ls {wheelhouse}/pip-*.whl | head -n1)/pip install --quiet --no-index "
            f"--find-links {wheelhouse} {quoted}"
        ),
    ]


def build_python_image(
    client: Any,
    requirements: list[str],
    tag_prefix: str,
    *,
    base: str = BASE_IMAGE,
    files: dict[str, str] | None = None,
    run: list[str] | None = None,
    venv: str = "/opt/venv",
    wheel_dir: str | None = None,
    sandbox_user: str | None = None,
    user_owned: list[str] | None = None,
) -> str:
    """Base + a venv with `requirements` installed offline + files + extra RUN steps. The
    venv's bin comes first on PATH. Wheels are downloaded on the host into `wheel_dir`
    (default: a cache folder named by the requirements). `sandbox_user` / `user_owned`: as
    in `build_layered_image` (the venv stays root's: packages are installed at build time)."""
    key = hashlib.sha256(json.dumps(sorted(requirements)).encode()).hexdigest()[:16]
    wheel_dir = wheel_dir or os.path.join(os.path.expanduser("~/.cache/rollhub/wheelhouses"), key)
    if not (os.path.isdir(wheel_dir) and any(name.startswith("pip-") for name in os.listdir(wheel_dir))):
        download_wheels(requirements, wheel_dir)
    wheelhouse = "/opt/wheelhouse"
    all_files = {wheelhouse: wheel_dir, **(files or {})}
    steps = python_venv_steps(wheelhouse, requirements, venv) + list(run or [])
    env = {"PATH": f"{venv}/bin:{BASE_ENV['PATH']}", "VIRTUAL_ENV": venv}
    return build_layered_image(
        client, base, all_files, steps, tag_prefix, env=env, sandbox_user=sandbox_user, user_owned=user_owned
    )
