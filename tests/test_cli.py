"""The `rollhub envs` commands: outputs, and every user mistake as one line + exit 2."""

import io
import json
import subprocess
import sys

import pytest

from rollhub.cli import main
from rollhub.envs.registry import _REGISTRY, register


def run(capsys, *argv):
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse usage errors exit from inside parse_args
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, *fragments):
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line, got: {err!r}"
    assert lines[0].startswith("rollhub: error:") and "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0]


def test_console_script_lists_builtin_envs():
    result = subprocess.run(["rollhub", "envs", "list"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    ids = [line.split()[0] for line in result.stdout.splitlines()[1:]]
    assert "rollhub/Sokoban-v0" in ids and "rollhub/Math-v0" in ids


def test_list_json(capsys):
    code, out, _ = run(capsys, "envs", "list", "--json")
    rows = {json.loads(line)["id"]: json.loads(line) for line in out.splitlines()}
    assert code == 0 and rows["rollhub/Sokoban-v0"]["available"] is True
    assert rows["rollhub/Sokoban-v0"]["needs"] == [] and rows["rollhub/Math-v0"]["description"]


def test_expert_sokoban_json_ends_with_success(capsys):
    code, out, _ = run(capsys, "envs", "try", "rollhub/Sokoban-v0", "--agent", "expert", "--seed", "3", "--json")
    assert code == 0
    last = json.loads(out.strip().splitlines()[-1])
    assert set(last) == {"env", "seed", "steps", "return", "success"}
    assert last["success"] is True and last["seed"] == 3 and last["env"] == "rollhub/Sokoban-v0"
    assert "[system]" in out and "[agent] <action>" in out


def test_random_agent_and_max_steps(capsys):
    code, out, _ = run(
        capsys,
        "envs",
        "try",
        "rollhub/Sokoban-v0",
        "--max-steps",
        "2",
        "--json",
        "--seed",
        "1",
        "--set",
        "solved_reward=0",
    )
    last = json.loads(out.strip().splitlines()[-1])
    assert code == 0 and last["steps"] <= 2


def test_human_agent_reads_stdin_until_eof(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("up\n<action>left</action>\n"))
    code, out, _ = run(capsys, "envs", "try", "rollhub/Sokoban-v0", "--agent", "human", "--json")
    last = json.loads(out.strip().splitlines()[-1])
    assert code == 0 and last["steps"] == 2
    assert "[agent] <action>up</action>" in out and "[agent] <action>left</action>" in out


def test_unknown_id_lists_close_matches(capsys):
    code, _, err = run(capsys, "envs", "try", "rollhub/Nope-v0")
    assert_one_line_error(code, err, "unknown env id 'rollhub/Nope-v0'")
    code, _, err = run(capsys, "envs", "try", "rollhub/Sokoban-v1")
    assert_one_line_error(code, err, "did you mean", "rollhub/Sokoban-v0")


def test_unknown_id_in_a_fresh_process():
    result = subprocess.run(["rollhub", "envs", "try", "rollhub/Nope-v0"], capture_output=True, text=True, timeout=120)
    assert_one_line_error(result.returncode, result.stderr, "unknown env id")


@pytest.mark.parametrize(
    "argv,fragments",
    [
        (["envs"], ["envs list"]),
        (["envs", "try"], ["ID"]),
        (["envs", "bogus"], ["invalid choice"]),
        (["envs", "try", "rollhub/Sokoban-v0", "--agent", "robot"], ["--agent", "robot"]),
        (["envs", "try", "rollhub/Sokoban-v0", "--seed", "abc"], ["--seed"]),
        (["envs", "try", "rollhub/Sokoban-v0", "--seed", "-1"], ["--seed must be >= 0"]),
        (["envs", "try", "rollhub/Sokoban-v0", "--max-steps", "0"], ["--max-steps must be >= 1"]),
        (["envs", "try", "rollhub/Sokoban-v0", "--set", "dim"], ["key.path=value"]),
        (["envs", "try", "rollhub/Sokoban-v0", "--set", "a.b=1"], ["flat"]),
        (["envs", "try", "rollhub/Sokoban-v0", "--set", "colour=red"], ["no argument 'colour'", "num_boxes"]),
        (["envs", "try", "rollhub/Sokoban-v0", "--set", "num_box=2"], ["did you mean num_boxes"]),
        (["envs", "try", "rollhub/Sokoban-v0", "--set", "num_boxes=two"], ["--set num_boxes", "expected int"]),
        (["envs", "try", "rollhub/Sokoban-v0", "--set", "dim=[6]"], ["(rows, cols)"]),
        (["envs", "try", "rollhub/Math-v0", "--set", "difficulty=2.5"], ["--set difficulty", "int"]),
        (["envs", "try", "rollhub/Sokoban-v0", "--set", "dim=2"], ["bad arguments", "4x4"]),
        (["envs", "try", "rollhub/Sokoban-v0", "--set", "reward=dense"], ["sparse"]),
        (["envs", "try", "rollhub/Sokoban-v0", "--set", "num_boxes=40"], ["do not fit"]),
        (
            ["envs", "try", "rollhub/Sokoban-v0", "--set", "num_boxes=5", "--set", "max_steps=2"],
            ["could not start", "fewer boxes"],
        ),
        (["envs", "try", "rollhub/Math-v0", "--set", "difficulty=9"], ["difficulty must be 1..5"]),
        (["envs", "try", "rollhub/Math-v0", "--set", "dataset_path=/no/such.jsonl"], ["not found"]),
        (["envs", "list", "--colour"], ["unrecognized arguments"]),
    ],
)
def test_user_mistakes_are_one_line_exit_2(capsys, argv, fragments):
    code, _, err = run(capsys, *argv)
    assert_one_line_error(code, err, *fragments)


@pytest.fixture
def toy_specs():
    register("test/NoExpert-v0", lambda: _NoExpert(), gymnasium_compat=False)
    register("test/NeedsDocker-v0", "rollhub.envs.sokoban.env:SokobanEnv", requires=("docker",), gymnasium_compat=False)
    register("test/NeedsExtra-v0", "rollhub_missing_extra_module:Env", extra="swe", gymnasium_compat=False)
    yield
    for key in ("test/NoExpert-v0", "test/NeedsDocker-v0", "test/NeedsExtra-v0"):
        _REGISTRY.pop(key, None)


class _NoExpert:
    """Minimal env object for the expert error path (built by a callable entry point)."""

    max_steps = 1
    action_tag = "action"
    tools = None

    async def reset(self, *, seed=None, options=None):
        return [{"role": "user", "content": "hi"}], {"anchor": 0, "success": False}

    async def step(self, action):
        return [{"role": "user", "content": "bye"}], 0.0, True, False, {"anchor": 0, "success": False}

    def expert_action(self):
        raise NotImplementedError

    def random_action(self, rng):
        raise NotImplementedError

    async def close(self):
        pass


def test_env_without_expert_or_random_agent(capsys, toy_specs):
    code, out, err = run(capsys, "envs", "try", "test/NoExpert-v0", "--agent", "expert")
    assert_one_line_error(code, err, "no scripted expert", "--agent random")
    code, out, err = run(capsys, "envs", "try", "test/NoExpert-v0", "--agent", "random", "--json")
    assert code == 0 and "[agent] <action>hi</action>" in out  # shaped like what the env's messages show


def test_env_needing_docker_or_a_missing_extra(capsys, toy_specs, monkeypatch):
    from rollhub.envs import checker

    monkeypatch.setattr(checker, "_docker_status", False)
    code, _, err = run(capsys, "envs", "try", "test/NeedsDocker-v0")
    assert_one_line_error(code, err, "cannot run here", "Docker")
    monkeypatch.setattr(checker, "_missing_extra_packages", lambda extra: ["swebench"])
    code, _, err = run(capsys, "envs", "try", "test/NeedsExtra-v0")
    assert_one_line_error(code, err, "pip install -e '.[swe]'")
    code, out, _ = run(capsys, "envs", "list")
    line = next(row for row in out.splitlines() if row.startswith("test/NeedsDocker-v0"))
    assert "docker (missing)" in line
