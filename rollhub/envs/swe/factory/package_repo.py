"""Host-side half of the task factory: a PyPI sdist turned into a reproducible git repo.

Everything that needs the network happens here, on the host, through pip (a package
registry): the sdist (which must ship its tests) and the test dependencies as wheels.
The repo gets one commit with a fixed identity and date, so its hash is the same on every
machine, and no `*.egg-info` (it would name files the tests never see).
"""

from __future__ import annotations

import email.parser
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from rollhub.core.errors import UserError
from rollhub.envs.swe.tasks import is_test_path

logger = logging.getLogger(__name__)

CACHE_DIR = Path(os.environ.get("ROLLHUB_SWE_CACHE", Path.home() / ".cache" / "rollhub" / "swe"))
#: fixed identity and clock: same content -> same commit hash everywhere
GIT_ENV = {
    "GIT_AUTHOR_NAME": "rollhub",
    "GIT_AUTHOR_EMAIL": "rollhub@localhost",
    "GIT_COMMITTER_NAME": "rollhub",
    "GIT_COMMITTER_EMAIL": "rollhub@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
}
GIT_COMMIT_ARGS = ["-c", "init.defaultBranch=main", "-c", "core.autocrlf=false", "-c", "commit.gpgsign=false"]
_REQUIREMENT = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;]+)$")
_SKIP_DIRS = {"docs", "doc", "examples", "benchmarks", "build", "dist", ".tox", ".git"}


def parse_requirement(text: str) -> tuple[str, str]:
    match = _REQUIREMENT.match(text.strip())
    if not match:
        raise UserError(f"'{text}' is not PACKAGE==VERSION (e.g. inflection==0.5.1)")
    return match.group(1), match.group(2)


def normalize_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def git(repo: Path, *args: str, input_text: str | None = None, check: bool = True) -> str:
    result = subprocess.run(
        ["git", *GIT_COMMIT_ARGS, *args],
        cwd=repo,
        env={**os.environ, **GIT_ENV},
        input=input_text,
        capture_output=True,
        text=True,
    )
    if check and result.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed in {repo}: {result.stderr.strip()[-1000:]}")
    return result.stdout


@dataclass
class PackageRepo:
    name: str
    version: str
    root: Path  # the git repo (what becomes /testbed)
    test_targets: list[str]  # pytest arguments, relative to the root
    source_files: list[str]  # candidate files for mutation, relative to the root
    import_root: str  # "" or "src": what the image's .pth points at
    requirements: list[str] = field(default_factory=list)  # runtime + test deps, as wheels
    base_commit: str = ""
    #: library modules whose doctests join the suite (`--doctest-modules`), relative to the root
    doctest_modules: list[str] = field(default_factory=list)

    @property
    def suite_targets(self) -> list[str]:
        return [*self.test_targets, *self.doctest_modules]

    def use_doctests(self) -> list[str]:
        """Run the doctests of the library modules that have examples as part of the suite (as
        many projects do); returns those modules."""
        self.doctest_modules = [
            rel
            for rel in self.source_files
            if ">>> " in (self.root / rel).read_text(encoding="utf-8", errors="replace")
        ]
        return self.doctest_modules

    @property
    def slug(self) -> str:
        return f"{normalize_name(self.name)}-{self.version}"


def _download_sdist(name: str, version: str, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    existing = [p for p in dest.iterdir() if p.suffix in (".gz", ".zip")]
    if not existing:
        argv = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--no-binary",
            ":all:",
            "--dest",
            str(dest),
            f"{name}=={version}",
        ]
        result = subprocess.run(argv, capture_output=True, text=True)
        if result.returncode != 0:
            raise UserError(f"could not download the sdist of {name}=={version}: {result.stderr.strip()[-500:]}")
        existing = [p for p in dest.iterdir() if p.suffix in (".gz", ".zip")]
    if not existing:
        raise UserError(f"{name}=={version} has no sdist on the index (the factory needs one that ships tests)")
    return existing[0]


def _extract(archive: Path, dest: Path) -> None:
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if archive.suffix == ".zip":
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(tmp)
    else:
        with tarfile.open(archive) as tf:
            tf.extractall(tmp, filter="data")
    entries = list(tmp.iterdir())
    top = entries[0] if len(entries) == 1 and entries[0].is_dir() else tmp
    shutil.rmtree(dest, ignore_errors=True)
    shutil.move(str(top), str(dest))
    shutil.rmtree(tmp, ignore_errors=True)
    for junk in list(dest.rglob("*.egg-info")) + list(dest.rglob("__pycache__")):
        shutil.rmtree(junk, ignore_errors=True)


def _runtime_requirements(root: Path) -> list[str]:
    """Requires-Dist of the sdist's PKG-INFO without extras, evaluated for Python 3.11 Linux."""
    pkg_info = root / "PKG-INFO"
    if not pkg_info.exists():
        return []
    from packaging.requirements import Requirement

    message = email.parser.Parser().parsestr(pkg_info.read_text(errors="replace"))
    env = {
        "python_version": "3.11",
        "python_full_version": "3.11.2",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "extra": "",
    }
    requirements = []
    for line in message.get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate(env):
            requirements.append(str(Requirement(f"{req.name}{req.specifier}")))
    return requirements


def _find_layout(root: Path) -> tuple[list[str], list[str], str]:
    import_root = "src" if (root / "src").is_dir() else ""
    targets = sorted(p.name for p in root.iterdir() if p.name in ("tests", "test", "testing") and p.is_dir())
    if not targets:
        targets = sorted(p.name for p in root.glob("test_*.py")) + sorted(p.name for p in root.glob("*_test.py"))
    if not targets:  # tests shipped inside the package (toolz/tests/)
        targets = sorted(
            p.relative_to(root).as_posix()
            for p in (root / import_root if import_root else root).glob("*/tests")
            if p.is_dir() and (p.parent / "__init__.py").is_file()
        )
    sources = []
    base = root / import_root if import_root else root
    for path in sorted(base.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if (
            is_test_path(rel)
            or set(Path(rel).parts) & _SKIP_DIRS
            or path.name in ("setup.py", "conftest.py", "noxfile.py")
        ):
            continue
        sources.append(rel)
    return targets, sources, import_root


def pin_requirements(requirements: list[str], cache_dir: Path = CACHE_DIR) -> list[str]:
    """Exact `name==version` of every wheel the requirements resolve to (pip excluded), so a
    rebuilt image runs the very same test stack as the one the tasks were validated in."""
    import hashlib

    from rollhub.sandbox.images import download_wheels

    key = hashlib.sha256(json.dumps(sorted(requirements)).encode()).hexdigest()[:16]
    wheel_dir = cache_dir / "resolve" / key
    if not (wheel_dir.is_dir() and any(p.name.startswith("pip-") for p in wheel_dir.iterdir())):
        download_wheels(requirements, str(wheel_dir))
    pins = []
    for wheel in sorted(wheel_dir.glob("*.whl")):
        name, version = wheel.name.split("-")[:2]
        if normalize_name(name) != "pip":
            pins.append(f"{normalize_name(name)}=={version}")
    return pins


def prepare_package(
    requirement: str, cache_dir: Path = CACHE_DIR, extra_test_requirements: list[str] | None = None
) -> PackageRepo:
    """Download (cached) and lay out PACKAGE==VERSION as a one-commit git repo."""
    name, version = parse_requirement(requirement)
    work = cache_dir / f"{normalize_name(name)}-{version}"
    archive = _download_sdist(name, version, work / "sdist")
    root = work / "repo"
    if not (root / ".git").is_dir():
        _extract(archive, root)
        git(root, "init", "-q")
        git(root, "add", "-A", ".")
        git(root, "commit", "-q", "-m", "Initial commit")
    targets, sources, import_root = _find_layout(root)
    if not targets:
        raise UserError(
            f"the sdist of {name}=={version} ships no tests (no tests/ folder, test_*.py or <package>/tests/); "
            "pick another package or version"
        )
    if not sources:
        raise UserError(f"found no library source files to mutate in {name}=={version}")
    requirements = ["pytest", *_runtime_requirements(root), *(extra_test_requirements or [])]
    base_commit = git(root, "rev-parse", "HEAD").strip()
    return PackageRepo(name, version, root, targets, sources, import_root, requirements, base_commit)
