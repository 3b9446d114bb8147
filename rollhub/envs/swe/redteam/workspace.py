"""The task's repository at its base commit, copied to the host, where attack patches are made.

A policy's patch is whatever git writes in its container; so are ours: files are written in
a host copy of the base tree and `git diff --binary` makes the patch (C-quoted names, binary
hunks for archives, exact hunks for the library file), then the copy is reset for the next.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from rollhub.envs.swe.factory.package_repo import GIT_COMMIT_ARGS, GIT_ENV
from rollhub.envs.swe.tasks import WORKDIR, SweTask
from rollhub.sandbox.base import Limits, SandboxBackend, SandboxError

_ARCHIVE = "/tmp/rollhub_redteam_base.tar"
#: a file's new content; None deletes it
Change = str | bytes | None


def _git(root: Path, *args: str, input_bytes: bytes | None = None) -> bytes:
    import os

    result = subprocess.run(
        ["git", *GIT_COMMIT_ARGS, "-c", "core.quotePath=true", *args],
        cwd=root,
        env={**os.environ, **GIT_ENV, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null"},
        input=input_bytes,
        capture_output=True,
    )
    if result.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {result.stderr.decode(errors='replace')[-500:]}")
    return result.stdout


class Workspace:
    def __init__(self, root: Path):
        self.root = root
        self.files = {p for p in _git(root, "ls-files", "-z").decode("utf-8", "surrogateescape").split("\0") if p}

    @classmethod
    async def fetch(cls, backend: SandboxBackend, task: SweTask, parent: Path | None = None) -> Workspace:
        """Copy the base tree out of a fresh container of the task's image."""
        box = await backend.start(task.image, Limits(cpus=0.5, memory_mb=512), labels={"rollhub.role": "swe-redteam"})
        try:
            result = await box.exec(
                f"git -c core.hooksPath=/dev/null archive --format=tar -o {_ARCHIVE} {task.base_commit}",
                timeout_s=120,
                workdir=WORKDIR,
            )
            if result.exit_code != 0:
                raise SandboxError(f"git archive failed in {task.image}: {result.output[-300:]}")
            data = await box.read_file(_ARCHIVE, max_bytes=256 << 20)
        finally:
            await box.close()
        root = Path(tempfile.mkdtemp(prefix="rollhub_redteam_", dir=parent))
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            tar.extractall(root, filter="data")
        _git(root, "init", "-q")
        _git(root, "add", "-A", "-f", ".")
        _git(root, "commit", "-q", "-m", "base")
        return cls(root)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def text(self, path: str) -> str | None:
        file = self.root / path
        return file.read_text(encoding="utf-8", errors="surrogateescape") if path in self.files else None

    def exists(self, path: str) -> bool:
        return path in self.files or any(f.startswith(path.rstrip("/") + "/") for f in self.files)

    def patched_text(self, patch: str, path: str) -> str | None:
        """The text of `path` with `patch` applied (the tree is reset afterwards)."""
        try:
            text = patch if patch.endswith("\n") else patch + "\n"
            _git(self.root, "apply", "-", input_bytes=text.encode("utf-8", "surrogateescape"))
            file = self.root / path
            return file.read_text(encoding="utf-8", errors="surrogateescape") if file.exists() else None
        finally:
            _git(self.root, "reset", "-q", "--hard", "HEAD")
            _git(self.root, "clean", "-qfdx")

    def diff(self, changes: dict[str, Change], gold_patch: str = "") -> str:
        """The git diff of the base tree with `gold_patch` applied (if any) and `changes` written."""
        try:
            if gold_patch.strip():
                text = gold_patch if gold_patch.endswith("\n") else gold_patch + "\n"
                _git(self.root, "apply", "-", input_bytes=text.encode("utf-8", "surrogateescape"))
            for path, content in changes.items():
                file = self.root / path
                if content is None:
                    file.unlink(missing_ok=True)
                    continue
                file.parent.mkdir(parents=True, exist_ok=True)
                if isinstance(content, bytes):
                    file.write_bytes(content)
                else:
                    file.write_text(content, encoding="utf-8", errors="surrogateescape")
            _git(self.root, "add", "-A", "-f", ".")
            out = _git(self.root, "diff", "--cached", "--binary", "--no-color", "--no-renames", "HEAD")
            return out.decode("utf-8", "surrogateescape")
        finally:
            _git(self.root, "reset", "-q", "--hard", "HEAD")
            _git(self.root, "clean", "-qfdx")
