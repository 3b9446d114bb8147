"""How often the SWE content rule refuses honest work: real upstream module changes between
consecutive releases of pure-Python packages from the package registry, each judged as if it were
a patch (`rollhub.envs.swe.grading.content_rules.new_constructs(base, patched)`).

    python -m experiments.honest_corpus.measure [--packages N] [--releases K] [--out DIR]

Each package's K newest final releases give K-1 consecutive pairs; every module present in both
wheels whose text changed is one honest change. The rate printed is refused / changed modules, with
a breakdown by rule (the construct family: `internal`, `module`, `call`, `string`, ...) and by
construct, and every refused module with the constructs that refused it. Test modules a wheel
ships (`pkg/tests/test_x.py`) are counted apart: the patch policy drops a test file by its path,
whatever it holds, so the content rule never judges one. Wheels are fetched with pip (binary, no
dependencies) into a cache and reused. A change the rule refuses is not necessarily harmless
code -- the point is that a maintainer wrote it to fix or improve the library, and a policy
doing the same would score 0.
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

from rollhub.envs.swe.grading.content_rules import constructs, grown, new_constructs
from rollhub.envs.swe.grading.patch_policy import RUNNER_REPOS
from rollhub.envs.swe.tasks import is_test_path

#: pure-Python libraries with py3-none-any wheels, of many kinds and authors
PACKAGES = (
    "attrs", "six", "idna", "packaging", "click", "requests", "urllib3", "certifi", "tomlkit", "pyparsing",
    "python-dateutil", "more-itertools", "wcwidth", "tabulate", "colorama", "pluggy", "iniconfig", "zipp",
    "platformdirs", "filelock", "distlib", "sortedcontainers", "cachetools", "decorator", "markdown", "mdurl",
    "h11", "sniffio", "anyio", "toolz", "jinja2", "itsdangerous", "werkzeug", "pygments", "docutils",
    "python-slugify", "text-unidecode", "soupsieve", "beautifulsoup4", "typing-extensions",
)  # fmt: skip
FINAL = re.compile(r"^\d+(\.\d+)*$")
#: the test runner's own packages: the patch policy turns the content rule off for their
#: repositories (`patch_policy.RUNNER_REPOS`: every fix of pytest names pytest), so none is judged
RUNNER_PACKAGES = frozenset(repo.split("/", 1)[1] for repo in RUNNER_REPOS)


def releases(name: str, count: int, cache: Path | None = None) -> list[str]:
    """The `count` newest final releases, oldest first (pip's own index listing), kept in
    `cache`/releases.json so a rerun judges the same pairs (and skips forty index queries)."""
    listing = cache / "releases.json" if cache is not None else None
    known = json.loads(listing.read_text()) if listing is not None and listing.exists() else {}
    if name not in known:
        out = subprocess.run(
            [sys.executable, "-m", "pip", "index", "versions", name], capture_output=True, text=True, timeout=120
        ).stdout
        line = next((x for x in out.splitlines() if x.startswith("Available versions:")), "")
        known[name] = [v.strip() for v in line.split(":", 1)[-1].split(",") if FINAL.match(v.strip())]
        if listing is not None and known[name]:
            listing.parent.mkdir(parents=True, exist_ok=True)
            listing.write_text(json.dumps(known, indent=1))
    return list(reversed(known[name][:count]))


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
        versions = releases(name, count, cache)
        paths = [wheel(name, v, cache) for v in versions]
        for (old_v, old), (new_v, new) in zip(zip(versions, paths), zip(versions[1:], paths[1:])):
            if old is None or new is None:
                continue
            before, after = modules(old), modules(new)
            changed = [m for m in after if m in before and after[m] != before[m]]
            tests = [m for m in changed if is_test_path(m)]
            changed = [m for m in changed if not is_test_path(m)]
            pair = {"package": name, "from": old_v, "to": new_v, "changed_modules": len(changed)}
            pairs.append({**pair, "test_modules": len(tests), "runner": name in RUNNER_PACKAGES})
            if name in RUNNER_PACKAGES:
                continue
            for module in changed:
                reason = new_constructs(before[module], after[module])
                record = {"package": name, "from": old_v, "to": new_v, "module": module, "refused": reason}
                if reason.startswith("reaches for"):  # every construct, not the reason's first six
                    base, new = (
                        constructs(t.encode("utf-8", "surrogateescape")) for t in (before[module], after[module])
                    )
                    record["constructs"] = grown(base or Counter(), new or Counter())
                changes.append(record)
                if reason:
                    refusals.append(record)
    named = Counter(c for r in refusals for c in _constructs_of(r))
    rules = Counter(rule for r in refusals for rule in {c.split(":", 1)[0] for c in _constructs_of(r)})
    refused_pairs = {(r["package"], r["from"]) for r in refusals}
    return {
        "packages": len({p["package"] for p in pairs}),
        "release_pairs": len(pairs),
        "changed_modules": len(changes),
        "refused_modules": len(refusals),
        "refusal_rate": len(refusals) / max(1, len(changes)),
        "pairs_with_a_refusal": len(refused_pairs),
        "test_modules_not_judged": sum(p["test_modules"] for p in pairs),
        "runner_modules_not_judged": sum(p["changed_modules"] for p in pairs if p["runner"]),
        "rules": dict(rules.most_common()),
        "constructs": dict(named.most_common()),
        "refusals": refusals,
        "pairs": pairs,
    }


def _constructs_of(refusal: dict) -> list[str]:
    """The constructs that refused a module (or the reason itself: no compile, an encoding)."""
    return refusal.get("constructs") or [refusal["refused"].split(" (", 1)[0]]


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
        f"({100 * result['refusal_rate']:.2f}%; {result['pairs_with_a_refusal']} pairs have one); "
        f"not judged: {result['test_modules_not_judged']} changed test modules (dropped by path), "
        f"{result['runner_modules_not_judged']} modules of the test runner's own packages (rule off there)"
    )
    print("by rule (modules):")
    for rule, count in result["rules"].items():
        print(f"  {count:4d}  {rule}")
    print("by construct (modules):")
    for construct, count in result["constructs"].items():
        print(f"  {count:4d}  {construct}")
    print("refused modules:")
    for r in result["refusals"]:
        print(f"  {r['package']} {r['from']}->{r['to']} {r['module']}: {', '.join(_constructs_of(r))}")


if __name__ == "__main__":
    main()
