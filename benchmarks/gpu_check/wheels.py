"""The wheels a bare GPU machine needs to run the device check: rollhub's runtime dependencies,
transitively, pinned at the versions installed here -- less what such a machine already has and
must keep (torch and its CUDA libraries, and numpy, which its torch was built against).

    python benchmarks/gpu_check/wheels.py                      # one `name==version` a line
    python benchmarks/gpu_check/wheels.py --target py312-cu130 # for that box: less what it ships
    python benchmarks/gpu_check/wheels.py --pip-flags py312-cu130

A target names a machine image: its Python (the wheels' tags) and what it already has. The
py312-cu130 box ships torch, CUDA and transformers, so transformers and everything it requires
are the box's too; rollhub's plots, TensorBoard and the Docker client are optional at run time
(a run without them logs a warning), so the check carries none of them: the repository and its
wheels must fit the 64 MiB a device run carries.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from importlib import metadata

#: provided by the GPU machine: never shadowed (a second torch or numpy would break its CUDA build)
BOX_PROVIDES = re.compile(r"^(torch|triton|numpy|nvidia-.*|cuda-.*|pytorch-triton.*)$")


def _name(requirement: str) -> str:
    return re.split(r"[\s;<>=!~\[(]", requirement, maxsplit=1)[0].lower().replace("_", "-")


@dataclass(frozen=True)
class Target:
    python: str  # pip's --python-version
    abi: str
    platforms: tuple[str, ...]
    ships: tuple[str, ...]  # distributions the box has, with everything they require


TARGETS = {
    "py312-cu130": Target(
        python="3.12",
        abi="cp312",
        platforms=("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"),
        ships=("transformers",),
    ),
}
#: optional at run time: a run without them warns (no plot, no TensorBoard, no containers)
NOT_CARRIED = ("matplotlib", "tensorboard", "docker")


def _requirements_of(name: str) -> set[str]:
    """`name` and every distribution it requires (installed here), transitively."""
    found: set[str] = set()
    todo = [name]
    while todo:
        current = todo.pop()
        if current in found:
            continue
        found.add(current)
        try:
            requirements = metadata.distribution(current).requires or []
        except metadata.PackageNotFoundError:
            continue
        todo += [_name(r) for r in requirements if not (";" in r and "extra" in r.split(";", 1)[1])]
    return found


def target_excludes(target: str) -> set[str]:
    spec = TARGETS[target]
    excluded: set[str] = set()
    for name in spec.ships:
        excluded |= _requirements_of(name)
    for name in NOT_CARRIED:
        excluded.add(name)
    return excluded


def pip_flags(target: str) -> list[str]:
    """`pip download` flags that fetch the target's wheels from this machine."""
    spec = TARGETS[target]
    flags = ["--python-version", spec.python, "--implementation", "cp", "--abi", spec.abi, "--abi", "abi3"]
    flags += ["--abi", "none"]
    for platform in spec.platforms:
        flags += ["--platform", platform]
    return flags + ["--platform", "any"]


def pinned_requirements(root: str = "rollhub", exclude: frozenset[str] | set[str] = frozenset()) -> list[str]:
    """`name==version` of every installed runtime dependency of `root` (extras and environment
    markers that do not hold here are skipped), torch's family, numpy and `exclude` (with what
    only they require) left out."""
    seen: dict[str, str] = {}
    todo = [root]
    while todo:
        name = todo.pop()
        try:
            distribution = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        for requirement in distribution.requires or []:
            if ";" in requirement:
                marker = requirement.split(";", 1)[1]
                if "extra" in marker:
                    continue
                try:
                    from packaging.markers import Marker

                    if not Marker(marker).evaluate():
                        continue
                except Exception:  # no packaging: keep it, pip download checks it anyway
                    pass
            dependency = _name(requirement)
            if BOX_PROVIDES.match(dependency) or dependency in seen or dependency == root or dependency in exclude:
                continue
            try:
                seen[dependency] = metadata.version(dependency)
            except metadata.PackageNotFoundError:
                continue
            todo.append(dependency)
    return [f"{name}=={version}" for name, version in sorted(seen.items())]


def main(argv: list[str]) -> int:
    if argv[:1] == ["--pip-flags"] and len(argv) == 2 and argv[1] in TARGETS:
        print(" ".join(pip_flags(argv[1])))
        return 0
    if argv[:1] == ["--target"] and len(argv) == 2 and argv[1] in TARGETS:
        lines = pinned_requirements(exclude=target_excludes(argv[1]))
    elif not argv:
        lines = pinned_requirements()
    else:
        print(f"usage: wheels.py [--target T | --pip-flags T], T one of {sorted(TARGETS)}", file=sys.stderr)
        return 2
    sys.stdout.write("".join(line + "\n" for line in lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
