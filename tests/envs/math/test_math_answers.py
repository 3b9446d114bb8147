import pytest

from rollhub.envs.math.answers import (
    _safe_for_sympy,
    extract_answer,
    extract_boxed,
    final_number,
    is_equivalent,
    normalize,
)


@pytest.mark.parametrize(
    "predicted,gold",
    [
        ("42", "42"),
        ("42.0", "42"),
        ("0.5", "1/2"),
        (r"\frac{1}{2}", "0.5"),
        (r"\dfrac12", "1/2"),
        ("1,000", "1000"),
        ("x = -3", "-3"),
        (r"2\sqrt{2}", r"\sqrt{8}"),
        (r"\frac{\pi}{2}", "pi/2"),
        ("3x+2", "2 + 3*x"),
        ("(1, 2)", "(1,2)"),
        (r"\$12", "12"),
        (r"50\%", "50"),
        ("The answer is 17.", "17"),
        (r"\text{12 apples}", "12"),
    ],
)
def test_equivalent_forms(predicted, gold):
    assert is_equivalent(predicted, gold)


@pytest.mark.parametrize(
    "predicted,gold", [("41", "42"), ("1/3", "0.33"), ("x+1", "x+2"), ("", "0"), (None, "1"), ("(1, 2)", "(2, 1)")]
)
def test_different_values(predicted, gold):
    assert not is_equivalent(predicted, gold)


def test_untrusted_text_never_reaches_eval(tmp_path):
    marker = tmp_path / "pwned"
    attack = f"__import__('os').system('touch {marker}')"
    assert not is_equivalent(attack, "5")
    assert not is_equivalent("(lambda: 2)()", "3")
    assert not _safe_for_sympy("(lambda: 1)()") and not _safe_for_sympy("x.__class__")
    assert not is_equivalent("9**9**9**9", "1")  # refused, not computed
    assert not marker.exists()


def test_extraction_order():
    assert extract_answer("think... <answer>\\boxed{3/4}</answer>") == ("3/4", True)
    assert extract_answer("<answer>7</answer> then <answer>8</answer>") == ("8", True)
    assert extract_answer("so \\boxed{\\frac{1}{2}} it is") == ("\\frac{1}{2}", True)
    assert extract_answer("12 apples and then 13.") == ("13", False)
    assert extract_answer("no numbers here") == (None, False)
    assert extract_boxed("\\boxed{\\frac{a}{b}} and \\boxed{x^{2}}") == "x^{2}"
    assert extract_boxed("\\boxed{unclosed") is None
    assert final_number("costs 1,234 dollars") == "1,234"


def test_normalize_strips_latex_decoration():
    assert normalize(r"$x = \frac{3}{4}$") == "((3)/(4))"
    assert normalize(r"90^\circ") == "90"
