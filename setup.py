"""Maps the flat top-level folders onto the `rollhub.*` import namespace.

pyproject.toml holds the metadata; this file only computes the package list, because the
folders are walked (new subpackages need no edit here) and remapped (`envs/` ->
`rollhub.envs`), which setuptools' declarative `packages.find` cannot express.
"""

from pathlib import Path

from setuptools import setup

HERE = Path(__file__).parent
PACKAGE_ROOTS = {
    "rollhub": "rollhub",
    "rollhub.envs": "envs",
    "rollhub.sandbox": "sandbox",
    "rollhub.rollout": "rollout",
    "rollhub.trainer": "trainer",
    "rollhub.benchmarks": "benchmarks",
}
DATA_SUFFIXES = ("*.json", "*.jsonl", "*.yaml", "*.txt", "*.md", "*.patch", "*.sh", "LICENSE*", "Dockerfile")


def walk_packages() -> tuple[list[str], dict[str, str], dict[str, list[str]]]:
    packages, package_dir, package_data = [], {}, {}
    for root_name, root_dir in PACKAGE_ROOTS.items():
        package_dir[root_name] = root_dir
        for init in sorted((HERE / root_dir).rglob("__init__.py")):
            rel = init.parent.relative_to(HERE / root_dir)
            name = ".".join([root_name, *rel.parts]) if rel.parts else root_name
            packages.append(name)
            package_data[name] = list(DATA_SUFFIXES) + ["data/*", "data/**/*"]
    return packages, package_dir, package_data


packages, package_dir, package_data = walk_packages()
setup(packages=packages, package_dir=package_dir, package_data=package_data, include_package_data=True)
