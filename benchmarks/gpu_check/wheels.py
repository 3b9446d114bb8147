"""The wheels a bare GPU machine needs to run the device check: rollhub's runtime dependencies,
transitively, pinned at the versions installed here -- less what such a machine already has and
must keep (torch and its CUDA libraries, and numpy, which its torch was built against).

    python benchmarks/gpu_check/wheels.py        # one `name==version` a line
"""

from __future__ import annotations

import re
import sys
from importlib import metadata

#: provided by the GPU machine: never shadowed (a second torch or numpy would break its CUDA build)
BOX_PROVIDES = re.compile(r"^(torch|triton|numpy|nvidia-.*|cuda-.*|pytorch-triton.*)$")


def _name(requirement: str) -> str:
    return re.split(r"[\s;<>=!~\[(]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def pinned_requirements(root: str = "rollhub") -> list[str]:
    """`name==version` of every installed runtime dependency of `root` (extras and environment
    markers that do not hold here are skipped), torch's family and numpy left out."""
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
            if BOX_PROVIDES.match(dependency) or dependency in seen or dependency == root:
                continue
            try:
                seen[dependency] = metadata.version(dependency)
            except metadata.PackageNotFoundError:
                continue
            todo.append(dependency)
    return [f"{name}=={version}" for name, version in sorted(seen.items())]


if __name__ == "__main__":
    sys.stdout.write("".join(line + "\n" for line in pinned_requirements()))
