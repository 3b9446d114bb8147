"""How often the SWE pytest-configuration rule refuses honest work: real changes of the files
pytest's rootdir search reads (`setup.cfg`, `pyproject.toml`, `tox.ini`, `pytest.ini`, ...)
between consecutive releases of the packages of `measure.PACKAGES`, each judged as if a patch
made it (`rollhub.envs.swe.grading.pytest_config.config_change`).

    python -m experiments.honest_corpus.measure_config [--packages N] [--releases K] [--out DIR]

Wheels carry no configuration, so the source distributions are fetched (pip, no binaries, no
dependencies) into a cache and reused. A change "touches a pytest setting" when a section or
table pytest reads (`[pytest]`, `[tool:pytest]`, `[tool.pytest.ini_options]`, ...) differs; the
rule must refuse those and should refuse none of the others. `conftest.py` files are counted
apart: a patch never changes one (they are test files, dropped by name, not judged by content).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from experiments.honest_corpus.measure import PACKAGES, releases
from rollhub.envs.swe.grading.pytest_config import CONFIG_NAMES, config_change, pytest_settings


def sdist(name: str, version: str, cache: Path, fetch: bool = True) -> Path | None:
    """The cached source distribution of `name==version`, fetched with pip when missing."""
    stems = {name.lower(), name.replace("-", "_").lower(), name.replace("_", "-").lower()}

    def found() -> list[Path]:
        return [
            p
            for p in cache.iterdir()
            if p.name.endswith((".tar.gz", ".zip")) and any(p.name.lower().startswith(f"{s}-{version}.") for s in stems)
        ]

    if not found() and fetch:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps",
             "--no-binary", ":all:", f"{name}=={version}", "-d", str(cache)],
            capture_output=True, timeout=300,
        )  # fmt: skip
    hits = found()
    return hits[0] if hits else None


def config_files(path: Path) -> dict[str, str]:
    """Configuration files and conftest.py of an sdist, by path below its top folder."""
    wanted = {*CONFIG_NAMES, "conftest.py"}
    out: dict[str, str] = {}
    if path.name.endswith(".zip"):
        with zipfile.ZipFile(path) as archive:
            members = [(n, lambda n=n: archive.read(n)) for n in archive.namelist()]
            return _pick(members, wanted)
    with tarfile.open(path) as archive:
        for member in archive.getmembers():
            if member.isfile() and member.name.rsplit("/", 1)[-1].lower() in wanted:
                handle = archive.extractfile(member)
                if handle is not None:
                    out[member.name.split("/", 1)[-1]] = handle.read().decode("utf-8", "surrogateescape")
    return out


def _pick(members, wanted) -> dict[str, str]:
    return {
        name.split("/", 1)[-1]: read().decode("utf-8", "surrogateescape")
        for name, read in members
        if name.rsplit("/", 1)[-1].lower() in wanted
    }


def measure(packages: tuple[str, ...], count: int, cache: Path, fetch: bool = True) -> dict:
    cache.mkdir(parents=True, exist_ok=True)
    changes, pairs = [], []
    for name in packages:
        versions = releases(name, count, cache)
        paths = [sdist(name, v, cache, fetch) for v in versions]
        for (old_v, old), (new_v, new) in zip(zip(versions, paths), zip(versions[1:], paths[1:])):
            if old is None or new is None:
                continue
            before, after = config_files(old), config_files(new)
            changed = sorted(p for p in after if p in before and after[p] != before[p])
            pairs.append({"package": name, "from": old_v, "to": new_v, "changed_files": changed})
            for path in changed:
                base_name = path.rsplit("/", 1)[-1].lower()
                record = {"package": name, "from": old_v, "to": new_v, "file": path}
                if base_name == "conftest.py":
                    record["kind"] = "conftest"
                else:
                    record["kind"] = "config"
                    record["touches_pytest"] = pytest_settings(base_name, before[path]) != pytest_settings(
                        base_name, after[path]
                    )
                    record["refused"] = config_change(base_name, before[path], after[path])
                changes.append(record)
    config = [c for c in changes if c["kind"] == "config"]
    quiet = [c for c in config if not c["touches_pytest"]]
    return {
        "packages": len({p["package"] for p in pairs}),
        "release_pairs": len(pairs),
        "config_changes": len(config),
        "refused": sum(1 for c in config if c["refused"]),
        "touching_pytest": sum(1 for c in config if c["touches_pytest"]),
        "touching_pytest_refused": sum(1 for c in config if c["touches_pytest"] and c["refused"]),
        "not_touching_pytest": len(quiet),
        "not_touching_pytest_refused": sum(1 for c in quiet if c["refused"]),
        "conftest_changes": sum(1 for c in changes if c["kind"] == "conftest"),
        "changes": changes,
        "pairs": pairs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--packages", type=int, default=len(PACKAGES), help="how many of the package list")
    parser.add_argument("--releases", type=int, default=3, help="newest final releases per package")
    parser.add_argument("--out", default="experiments/honest_corpus/results")
    parser.add_argument("--cache", default="runs/honest_corpus_sdists")
    parser.add_argument("--cached-only", action="store_true", help="judge only the sdists already in the cache")
    args = parser.parse_args()
    result = measure(PACKAGES[: args.packages], args.releases, Path(args.cache), fetch=not args.cached_only)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config_rule_refusals.json").write_text(json.dumps(result, indent=1))
    print(
        f"{result['config_changes']} changed configuration files in {result['release_pairs']} release pairs of "
        f"{result['packages']} packages: the config rule refuses {result['refused']}; "
        f"{result['touching_pytest']} touch a pytest setting ({result['touching_pytest_refused']} refused), "
        f"{result['not_touching_pytest']} touch none ({result['not_touching_pytest_refused']} refused); "
        f"{result['conftest_changes']} conftest.py changes (test files: dropped by name)"
    )
    for change in result["changes"]:
        if change.get("refused"):
            pytest_note = "pytest setting" if change["touches_pytest"] else "no pytest setting"
            print(f"  {change['package']} {change['from']}->{change['to']} {change['file']} ({pytest_note}): "
                  f"{change['refused']}")  # fmt: skip


if __name__ == "__main__":
    main()
