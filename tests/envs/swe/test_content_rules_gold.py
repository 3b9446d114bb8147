"""Every shipped gold patch passes the patch policy judged on whole modules, with their base texts.

A base text is the module at the task's base commit. It lives in the task image (read there
with `git show`, docker tests) and, on a machine that built the images, can be rebuilt on the
host: the package's pristine repo (the factory's cache) is the gold patch applied, so the base
is the gold patch reverse-applied to it."""

from __future__ import annotations

import json

import pytest

from rollhub.envs.swe.factory.package_repo import CACHE_DIR, normalize_name
from rollhub.envs.swe.grading.patch_policy import (
    FileSection,
    Hunk,
    PatchPolicy,
    apply_hunks,
    parse_git_diff,
    sanitize_patch,
)
from rollhub.envs.swe.tasks import SHIPPED_TASKS

ROWS = [json.loads(line) for line in SHIPPED_TASKS.read_text().splitlines()]


def one_per_package(rows):
    seen: dict[str, dict] = {}
    for row in rows:
        seen.setdefault(row["repo"], row)
    return list(seen.values())


def reverse(section: FileSection, text: str) -> str | None:
    """`text` with the section's hunks undone (the base of a modified file)."""
    undo = FileSection(path=section.path, old_exists=section.new_exists, new_exists=section.old_exists)
    flip = {"+": "-", "-": "+"}
    for hunk in section.hunks:
        lines = [flip.get(line[:1], line[:1]) + line[1:] for line in hunk.lines]
        undo.hunks.append(Hunk(hunk.new_start, hunk.new_count, hunk.old_start, hunk.old_count, lines))
    return apply_hunks(text, undo)


def judged(row: dict, base_texts: dict[str, str]):
    sections = parse_git_diff(row["patch"])
    policy = PatchPolicy.for_task(
        [],
        json.loads(row["FAIL_TO_PASS"]) + json.loads(row["PASS_TO_PASS"]),
        repo=row["repo"],
        base_files={s.path for s in sections},
        base_texts=base_texts,
        eval_script=row["eval_script"],
    )
    return sanitize_patch(row["patch"], policy)


def pristine_base_texts(row: dict) -> dict[str, str] | None:
    meta = row["rollhub"]
    repo = CACHE_DIR / f"{normalize_name(meta['package'])}-{meta['package_version']}" / "repo"
    if not (repo / ".git").is_dir():
        return None
    texts = {}
    for section in parse_git_diff(row["patch"]):
        pristine = (repo / section.path).read_bytes().decode("utf-8", "surrogateescape")
        base = reverse(section, pristine)
        assert base is not None, f"{row['instance_id']}: the gold patch does not reverse on the pristine repo"
        texts[section.path] = base
    return texts


def _check_from_cache(rows):
    refused = []
    for row in rows:
        texts = pristine_base_texts(row)
        if texts is None:
            pytest.skip(f"no pristine repo of {row['repo']} under {CACHE_DIR}: run `rollhub swe build-images`")
        sanitized = judged(row, texts)
        if sanitized.dropped or sanitized.rejected or sanitized.patch != row["patch"]:
            refused.append((row["instance_id"], sanitized.dropped, sanitized.rejected))
    assert refused == []


def test_gold_patches_of_every_package_pass_the_policy_on_whole_modules():
    _check_from_cache(one_per_package(ROWS))


@pytest.mark.slow
def test_every_shipped_gold_patch_passes_the_policy_on_whole_modules():
    _check_from_cache(ROWS)


def _image_base_texts(client, row):
    texts = {}
    for section in parse_git_diff(row["patch"]):
        out = client.containers.run(
            row["image"], ["git", "-C", "/testbed", "show", f"{row['base_commit']}:{section.path}"], remove=True
        )
        texts[section.path] = out.decode("utf-8", "surrogateescape")
    return texts


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.parametrize("sample", [True, False], ids=["one-per-package", "all"])
def test_gold_patches_pass_with_base_texts_read_in_the_task_images(sample):
    import docker

    from rollhub.envs.checker import docker_available

    if not docker_available():
        pytest.skip("no Docker engine answers (start dockerd or set DOCKER_HOST)")
    client = docker.from_env()
    rows = one_per_package(ROWS) if sample else ROWS
    refused = []
    try:
        for row in rows:
            try:
                texts = _image_base_texts(client, row)
            except docker.errors.ImageNotFound:
                pytest.skip(f"{row['image']} is not built: run `rollhub swe build-images {SHIPPED_TASKS}`")
            cached = pristine_base_texts(row)
            assert cached is None or cached == texts, f"{row['instance_id']}: host and image base texts differ"
            sanitized = judged(row, texts)
            if sanitized.dropped or sanitized.rejected or sanitized.patch != row["patch"]:
                refused.append((row["instance_id"], sanitized.dropped, sanitized.rejected))
    finally:
        client.close()
    assert refused == []


@pytest.mark.docker
@pytest.mark.slow
async def test_the_grader_judges_whole_modules_read_in_the_task_image(backend):
    """Through `evaluate_patch`: the gold patch resolves, and the same module with a new dynamic
    call is dropped by the whole-module judge (its `builtin:` key, not the hunk judge's `word:`)."""
    import docker

    from rollhub.envs.checker import docker_available
    from rollhub.envs.swe.grading.evaluate import evaluate_patch
    from rollhub.envs.swe.tasks import load_tasks

    if not docker_available():
        pytest.skip("no Docker engine answers (start dockerd or set DOCKER_HOST)")
    task = load_tasks(SHIPPED_TASKS)[0]
    row = next(r for r in ROWS if r["instance_id"] == task.instance_id)
    client = docker.from_env()
    try:
        (path, base), *_ = _image_base_texts(client, row).items()
    except docker.errors.ImageNotFound:
        pytest.skip(f"{task.image} is not built: run `rollhub swe build-images {SHIPPED_TASKS}`")
    finally:
        client.close()
    (section,) = parse_git_diff(task.patch)
    fixed = apply_hunks(base, section)
    attack = fixed.rstrip("\n") + "\n_run = getattr(__builtins__, 'ex' + 'ec')\n"
    before, after = base.split("\n")[:-1], attack.split("\n")[:-1]
    patch = (
        f"diff --git a/{path} b/{path}\nindex 1111111..2222222 100644\n--- a/{path}\n+++ b/{path}\n"
        f"@@ -1,{len(before)} +1,{len(after)} @@\n"
        + "".join(f"-{line}\n" for line in before)
        + "".join(f"+{line}\n" for line in after)
    )
    gold = await evaluate_patch(backend, task, task.patch)
    assert gold.reward == 1.0 and not gold.sanitized.dropped
    forged = await evaluate_patch(backend, task, patch)
    assert forged.reward == 0.0 and not forged.infra_failure
    assert "builtin:exec" in forged.sanitized.dropped[path]
