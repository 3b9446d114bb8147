"""rollhub/config.py: YAML + --set overrides into typed dataclasses, with clear errors."""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from rollhub.core.config import ALLOW_NONFINITE, apply_overrides, config_to_dict, load_config, parse_override
from rollhub.core.errors import UserError


@dataclass
class Optim:
    lr: float = 1e-3
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])


@dataclass
class Run:
    name: str = "run"
    algo: Literal["grpo", "gigpo"] = "grpo"
    steps: int = 10
    resume: Path | None = None
    use_std: bool = True
    optim: Optim = field(default_factory=Optim)
    env_kwargs: dict[str, int] = field(default_factory=dict)

    def validate(self) -> None:
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")


def write(tmp_path, text):
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    return path


def test_yaml_and_overrides_build_typed_tree(tmp_path):
    path = write(tmp_path, "name: a\nalgo: gigpo\noptim:\n  lr: 1\n")
    cfg = load_config(Run, path, ["steps=5", "optim.betas=[0.5, 0.6]", "resume=ckpt", "env_kwargs.dim=6"])
    assert cfg.name == "a" and cfg.algo == "gigpo" and cfg.steps == 5
    assert cfg.optim.lr == 1.0 and isinstance(cfg.optim.lr, float)  # int widened to float
    assert cfg.optim.betas == [0.5, 0.6] and cfg.resume == Path("ckpt") and cfg.env_kwargs == {"dim": 6}
    assert config_to_dict(cfg)["resume"] == "ckpt" and config_to_dict(cfg)["optim"]["lr"] == 1.0


def test_defaults_without_file():
    cfg = load_config(Run)
    assert cfg == Run()


@pytest.mark.parametrize(
    "overrides,fragments",
    [
        (["stepz=3"], ["unknown config key 'stepz'", "did you mean steps", "allowed keys"]),
        (["optim.lrr=3"], ["'optim.lrr'", "lr"]),
        (["steps=many"], ["steps", "expected int"]),
        (["steps=true"], ["steps", "expected int"]),
        (["algo=ppo"], ["algo", "'grpo', 'gigpo'"]),
        (["optim=3"], ["optim", "section"]),
        (["optim.betas=0.9"], ["optim.betas", "list"]),
        (["optim.betas=[0.9, x]"], ["optim.betas[1]", "float"]),
        (["use_std=maybe"], ["use_std", "bool"]),
        (["steps=0"], ["steps must be >= 1"]),
        (["no_equals"], ["key.path=value"]),
        (["=3"], ["empty key"]),
        (["name.sub=3"], ["name", "expected str"]),
    ],
)
def test_mistakes_name_the_key_and_what_is_allowed(overrides, fragments):
    with pytest.raises(UserError) as caught:
        load_config(Run, None, overrides)
    for fragment in fragments:
        assert fragment in str(caught.value)


def test_file_errors(tmp_path):
    with pytest.raises(UserError, match="not found"):
        load_config(Run, tmp_path / "missing.yaml")
    with pytest.raises(UserError, match="not valid YAML"):
        load_config(Run, write(tmp_path, "name: [unclosed\n"))
    with pytest.raises(UserError, match="'name' is given twice"):  # YAML alone would keep the last silently
        load_config(Run, write(tmp_path, "name: a\nsteps: 2\nname: b\n"))
    with pytest.raises(UserError, match="top level must be a mapping"):
        load_config(Run, write(tmp_path, "- 1\n- 2\n"))
    assert load_config(Run, write(tmp_path, "")) == Run()


def test_override_parsing():
    assert parse_override("a.b=0.5") == (["a", "b"], 0.5)
    assert parse_override("name=hello world") == (["name"], "hello world")
    assert parse_override("x=") == (["x"], "")
    data = apply_overrides({"a": {"b": 1}}, ["a.c=2", "d.e=[1, 2]"])
    assert data == {"a": {"b": 1, "c": 2}, "d": {"e": [1, 2]}}
    with pytest.raises(UserError, match="'name' is not a section"):
        apply_overrides({"name": "a"}, ["name.sub=3"])


@dataclass
class Limits:
    """Float shapes the loader meets: optional, listed, mapped, and one that allows nan/inf."""

    timeout_s: float | None = None
    weights: list[float] = field(default_factory=list)
    scales: dict[str, float] = field(default_factory=dict)
    threshold: float = field(default=0.0, metadata={ALLOW_NONFINITE: True})


@pytest.mark.parametrize(
    "override,key",
    [
        ("timeout_s=.nan", "timeout_s"),
        ("timeout_s=.inf", "timeout_s"),
        ("timeout_s=-.inf", "timeout_s"),
        ("timeout_s=nan", "timeout_s"),  # a YAML string that float() would read
        ("timeout_s=1e999", "timeout_s"),  # YAML 1.1 keeps it a string; float() makes it inf
        (f"timeout_s={10**400}", "timeout_s"),  # an int too large for a float
        ("weights=[1.0, .nan]", "weights[1]"),
        ("scales.a=.inf", "scales.a"),
    ],
)
def test_non_finite_floats_are_refused_with_their_key(override, key):
    """nan passes every range check (nan < 0 is false), so the loader refuses it for every float."""
    with pytest.raises(UserError) as caught:
        load_config(Limits, None, [override])
    message = str(caught.value)
    assert message.startswith(f"{key}: ") and "not a finite number" in message


def test_a_field_may_allow_non_finite_floats():
    assert load_config(Limits, None, ["threshold=.inf"]).threshold == float("inf")
    assert load_config(Limits, None, ["timeout_s=null", "weights=[1, 2.5]"]) == Limits(None, [1.0, 2.5])


@dataclass
class Inner:
    rate: float = 1.0
    mode: str = "a"

    def validate(self) -> None:
        if self.rate <= 0:
            raise ValueError("inner.rate must be > 0")
        if self.mode != "a":
            raise ValueError("mode must be 'a'")


@dataclass
class Outer:
    inner: Inner = field(default_factory=Inner)


def test_validate_messages_name_the_dotted_key_once():
    with pytest.raises(UserError) as caught:
        load_config(Outer, None, ["inner.rate=0"])
    assert str(caught.value) == "inner.rate must be > 0"  # not "inner: inner.rate ..."
    with pytest.raises(UserError) as caught:
        load_config(Outer, None, ["inner.mode=b"])
    assert str(caught.value) == "inner: mode must be 'a'"
