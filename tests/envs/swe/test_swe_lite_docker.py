"""SWE-lite through real containers: a tiny build (two packs of two tasks, one training and one
held-out), the gold patch resolving and the empty patch failing every task through SWE-v0's own
episodes (the differential oracle included), and no copy of any task's correct function in its
task image (files or git objects), with the clean image as the positive control."""

from __future__ import annotations

import dataclasses
import json

import pytest

pytest.importorskip("swebench")

#: 50 s on a quiet 2-core machine, 4 min at load 20 (two image builds, 12 graded episodes): run with -m slow
pytestmark = [pytest.mark.docker, pytest.mark.slow]

#: searches every file and every git object of a container for the needle (a whole function)
FIND = r"""
import os, subprocess, sys
needle = open('/tmp/needle.txt', 'rb').read()
hits = []
for top, dirs, files in os.walk('/'):
    if top == '/':
        dirs[:] = [d for d in dirs if d not in ('proc', 'sys', 'dev')]
    for name in files:
        path = os.path.join(top, name)
        if path == '/tmp/needle.txt':
            continue
        try:
            with open(path, 'rb') as f:
                if needle in f.read():
                    hits.append(path)
        except OSError:
            pass
objects = subprocess.run(['git', '-C', '/testbed', 'cat-file', '--batch-all-objects', '--batch'], capture_output=True)
if needle in objects.stdout:
    hits.append('git-object')
print(sorted(hits))
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    import asyncio

    from rollhub.envs.checker import docker_available

    if not docker_available():
        pytest.skip("no Docker engine answers (start dockerd or set DOCKER_HOST)")
    from rollhub.envs.swe.lite.build import BuildOptions, build
    from rollhub.sandbox.docker_backend import DockerBackend

    out = tmp_path_factory.mktemp("swelite") / "tasks.jsonl"

    async def run():
        backend = DockerBackend()
        try:
            return await build(backend, backend.client, BuildOptions(train=2, eval=2, pack_size=2, out=out))
        finally:
            await backend.close()

    summary = asyncio.run(run())
    return out, summary


def test_the_build_makes_two_images_per_pack_and_verified_rows(built):
    out, summary = built
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert summary["tasks"] == {"train": 2, "eval": 2} and summary["images"] == 4
    assert len({r["image"] for r in rows}) == 2  # one task image per pack, shared by its tasks
    for row in rows:
        f2p, p2p = json.loads(row["FAIL_TO_PASS"]), json.loads(row["PASS_TO_PASS"])
        folder = row["rollhub"]["lite"]["folder"]
        assert f2p and p2p and all(t.startswith(f"{folder}/") for t in f2p + p2p)
        assert row["patch"].count("diff --git") == 1 and f"a/{folder}/" in row["patch"]
    assert json.loads((out.parent / "splits.json").read_text())["eval"] == ["swe-lite-eval-p00"]


async def test_gold_resolves_and_the_empty_patch_fails_through_the_env(built, backend):
    from rollhub.envs.swe.lite.check import check
    from rollhub.envs.swe.tasks import load_tasks

    out, _ = built
    summary = await check(backend, load_tasks(out, split="all"), concurrency=2)
    assert summary["tasks"] == 4
    assert summary["gold_resolved"] == 4 and summary["gold_oracle_agreed"] == 4, summary["failures"]
    assert summary["noop_resolved"] == 0 and summary["infra_failures"] == 0, summary["failures"]


async def test_the_exploring_expert_resolves_by_editing(built, backend):
    from rollhub.envs.swe.lite.check import check
    from rollhub.envs.swe.lite.env import SWELiteEnv
    from rollhub.envs.swe.tasks import load_tasks

    out, _ = built
    tasks = load_tasks(out, split="eval")
    summary = await check(backend, tasks, concurrency=2, env_cls=SWELiteEnv)
    assert summary["gold_resolved"] == len(tasks) == 2 and summary["noop_resolved"] == 0, summary["failures"]


async def test_the_task_image_holds_no_copy_of_any_correct_function(built, backend):
    from rollhub.envs.swe.grading.oracle import clean_image
    from rollhub.envs.swe.tasks import load_tasks
    from rollhub.sandbox.base import Limits

    out, _ = built
    root = dataclasses.replace(Limits(cpus=1.0, memory_mb=1024), user="root")

    async def hits(image: str, needle: str) -> list[str]:
        async with await backend.start(image, root) as box:
            await box.write_file("/tmp/needle.txt", needle)
            await box.write_file("/tmp/find.py", FIND)
            result = await box.exec("python /tmp/find.py", 300, "/")
            return json.loads(result.output.strip().splitlines()[-1].replace("'", '"'))

    for task in load_tasks(out, split="all"):
        folder = task.row["rollhub"]["lite"]["folder"]
        # the gold patch's removed line is the bug, its added line the correct code: the correct
        # function is the module in the clean image; take its text there
        module = task.row["rollhub"]["mutation"]["file"]
        async with await backend.start(clean_image(task), root) as box:
            clean_text = (await box.read_file(f"/testbed/{module}")).decode()
        function = task.row["rollhub"]["mutation"]["function"]
        start = clean_text.index(f"def {function}(")
        end = clean_text.find("\n\n\ndef ", start)
        needle = clean_text[start : end if end != -1 else len(clean_text)]
        in_clean = await hits(clean_image(task), needle)
        assert f"/testbed/{module}" in in_clean and "git-object" in in_clean, in_clean  # the probe works
        assert await hits(task.image, needle) == [], (folder, needle)
