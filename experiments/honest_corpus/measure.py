"""How often the SWE content rule refuses honest work: real upstream module changes between
consecutive releases of pure-Python packages from the package registry, each judged as if it were
a patch (`rollhub.envs.swe.content_rules.new_constructs(base, patched)`).

    python -m experiments.honest_corpus.measure [--packages N] [--releases K] [--out DIR]

Each package's K newest final releases give K-1 consecutive pairs; every module present in both
wheels whose text changed is one honest change. The rate printed is refused / changed modules, with
the constructs that refused them. Wheels are fetched with pip (binary, no dependencies) into a cache
and reused. A change the rule refuses is not necessarily harmless code -- the point is that a
maintainer wrote it to fix or improve the library, and a policy doing the same would score 0.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import zipfile
from collections import Counter
from pathlib import Path

from rollhub.envs.swe.content_rules import new_constructs

#: pure-Python libraries with py3-none-any wheels, of many kinds and authors
PACKAGES = (
    "attrs", "six", "idna", "packaging", "click", "requests", "urllib3", "certifi", "tomlkit", "pyparsing",
    "python-dateutil", "more-itertools", "wcwidth", "tabulate", "colorama", "pluggy", "iniconfig", "zipp",
    "platformdirs", "filelock", "distlib", "sortedcontainers", "cachetools", "decorator", "markdown", "mdurl",
    "h11", "sniffio", "anyio", "toolz", "jinja2", "itsdangerous", "werkzeug", "pygments", "docutils",
    "python-slugify", "text-unidecode", "soupsieve", "beautifulsoup4", "typing-extensions",
)  # fmt: skip
FINAL = re.compile(r"^\d+(\.\d+)*$")


def releases(name: str, count: int) -> list[str]:
    """The `count` newest final releases, oldest first (pip's own index listing)."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", name], capture_output=True, text=True, timeout=120
    ).stdout
    line = next((x for x in out.splitlines() if x.startswith("Available versions:")), "")
    versions = [v.strip() for v in line.split(":", 1)[-1].split(",") if FINAL.match(v.strip())]
    return list(reversed(versions[:count]))


def wheel(name: str, version: str, cache: Path) -> Path | None:
    prefix = name.replace("-", "_").lower()
    found = [p for p in cache.glob("*.whl") if p.name.lower().startswith(f"{prefix}-{version}-")]
    if not found:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
             f"{name}=={version}", "-d", str(cache)],
            capture_output=True, timeout=300,
        )  # fmt: skip
        found = [p for p in cache.glob("*.whl") if p.name.lower().startswith(f"{prefix}-{version}-")]
    return found[0] if found else None


def modules(path: Path) -> dict[str, str]:
    with zipfile.ZipFile(path) as archive:
        return {
            n: archive.read(n).decode("utf-8", "surrogateescape")
            for n in archive.namelist()
            if n.endswith(".py") and ".dist-info/" not in n
        }


def measure(packages: tuple[str, ...], count: int, cache: Path) -> dict:
    cache.mkdir(parents=True, exist_ok=True)
    changes, refusals, pairs = [], [], []
    for name in packages:
        versions = releases(name, count)
        paths = [wheel(name, v, cache) for v in versions]
        for (old_v, old), (new_v, new) in zip(zip(versions, paths), zip(versions[1:], paths[1:])):
            if old is None or new is None:
                continue
            before, after = modules(old), modules(new)
            changed = [m for m in after if m in before and after[m] != before[m]]
            pairs.append({"package": name, "from": old_v, "to": new_v, "changed_modules": len(changed)})
            for module in changed:
                reason = new_constructs(before[module], after[module])
                record = {"package": name, "from": old_v, "to": new_v, "module": module, "refused": reason}
                changes.append(record)
                if reason:
                    refusals.append(record)
    constructs = Counter(
        c.strip() for r in refusals for c in r["refused"].split(":", 1)[-1].split(",") if ":" in r["refused"]
    )
    refused_pairs = {(r["package"], r["from"]) for r in refusals}
    return {
        "packages": len({p["package"] for p in pairs}),
        "release_pairs": len(pairs),
        "changed_modules": len(changes),
        "refused_modules": len(refusals),
        "refusal_rate": len(refusals) / max(1, len(changes)),
        "pairs_with_a_refusal": len(refused_pairs),
        "constructs": dict(constructs.most_common()),
        "refusals": refusals,
        "pairs": pairs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--packages", type=int, default=len(PACKAGES), help="how many of the package list")
    parser.add_argument("--releases", type=int, default=3, help="newest final releases per package")
    parser.add_argument("--out", default="experiments/honest_corpus/results")
    parser.add_argument("--cache", default="runs/honest_corpus_wheels")
    args = parser.parse_args()
    result = measure(PACKAGES[: args.packages], args.releases, Path(args.cache))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "content_rule_refusals.json").write_text(json.dumps(result, indent=1))
    print(
        f"{result['changed_modules']} changed modules in {result['release_pairs']} release pairs of "
        f"{result['packages']} packages: the content rule refuses {result['refused_modules']} "
        f"({100 * result['refusal_rate']:.1f}%; {result['pairs_with_a_refusal']} pairs have one)"
    )
    for construct, count in result["constructs"].items():
        print(f"  {count:4d}  {construct}")


if __name__ == "__main__":
    main()
