"""`rollhub config show`: every knob of a run, with its value, default and one line of doc."""

from __future__ import annotations

import json

from rollhub.cli import main
from rollhub.core.config import load_config
from rollhub.trainer.config import RunConfig
from rollhub.trainer.config_cli import knobs


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def test_every_knob_has_a_doc_line():
    rows = knobs()
    assert len(rows) > 100
    missing = [row.key for row in rows if not row.doc.strip()]
    assert not missing, f"knobs without a comment on their dataclass field: {missing}"
    assert all("\n" not in row.doc for row in rows)


def test_knob_names_are_the_names_a_recipe_takes():
    """Setting every knob to its own default by its dotted name loads, and changes nothing."""
    rows = knobs()
    config = load_config(RunConfig, None, [f"{row.key}={json.dumps(row.default)}" for row in rows])
    assert [row.value for row in knobs(config)] == [row.default for row in rows]
    assert len({row.key for row in rows}) == len(rows)


def test_a_value_set_in_a_recipe_shows_as_set(tmp_path, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("loss:\n  kl_coef: 0.05\ntrain: {steps: 3}\nenv: {kwargs: {dim: 7}}\n")
    code, out, err = _run(capsys, "config", "show", str(recipe), "--set", "optim.lr=0.5", "--json")
    assert code == 0, err
    rows = {row["key"]: row for row in map(json.loads, out.splitlines())}
    assert rows["loss.kl_coef"]["value"] == 0.05 and rows["loss.kl_coef"]["set"] is True
    assert rows["loss.kl_coef"]["default"] == RunConfig().loss.kl_coef
    assert rows["train.steps"]["value"] == 3 and rows["train.steps"]["set"] is True
    assert rows["env.kwargs"]["value"] == {"dim": 7} and rows["env.kwargs"]["set"] is True
    assert rows["optim.lr"]["value"] == 0.5 and rows["optim.lr"]["set"] is True  # --set counts too
    assert rows["optim.epochs"]["set"] is False and rows["optim.epochs"]["value"] == rows["optim.epochs"]["default"]
    assert all(row["doc"] for row in rows.values())


def test_table_marks_the_recipe_values(capsys):
    code, out, err = _run(capsys, "config", "show", "configs/sokoban_tiny.yaml", "--only", "engine.")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[1].split() == ["knob", "value", "default", "doc"]
    rows = {line[2:].split()[0]: line for line in lines[2:]}
    assert all(key.startswith("engine.") for key in rows)
    assert rows["engine.dtype"].startswith("*") and rows["engine.dtype"][2:].split()[1:3] == ["bfloat16", "auto"]
    assert rows["engine.replicas"].startswith(" ") and "launched servers" in rows["engine.replicas"]


def test_defaults_without_a_recipe_and_user_errors(capsys):
    code, out, _ = _run(capsys, "config", "show")
    assert code == 0 and "no recipe" in out.splitlines()[0]
    assert not any(line.startswith("*") for line in out.splitlines()[1:])
    code, _, err = _run(capsys, "config", "show", "--only", "nosuch.")
    assert code == 2 and "nosuch." in err and "Traceback" not in err
    code, _, err = _run(capsys, "config", "show", "--set", "loss.nosuch=1")
    assert code == 2 and "loss.nosuch" in err


def test_doc_is_the_field_comment_inline_or_above():
    from rollhub.trainer.config_cli import _module_field_docs

    source = """
class Outer:
    inline: int = 1  # the inline one
    # --- a group header documents nothing ---
    # the block above,
    # two lines of it
    above: int = 2
    wrapped: tuple = (
        "x"  # a comment inside a wrapped statement
    )
    bare: int = 3

    class Inner:
        nested: int = 0  # a nested class
"""
    docs = _module_field_docs(source)
    assert docs["Outer"] == {
        "inline": "the inline one",
        "above": "the block above, two lines of it",
        "wrapped": "a comment inside a wrapped statement",
        "bare": "",
    }
    assert docs["Outer.Inner"] == {"nested": "a nested class"}
