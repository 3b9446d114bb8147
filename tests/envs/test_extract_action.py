"""`extract_action` finds what the regex `<tag>(.*?)</tag>` finds (the last match), in time linear in
the reply: a reply of thousands of unclosed tags took seconds on the event loop with the regex."""

import random
import re

from rollhub.envs.base import extract_action


def _regex(text: str, tag: str) -> str | None:
    found = re.findall(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", text, flags=re.DOTALL)
    return found[-1].strip() if found else None


def test_the_last_tag_wins_as_the_regex_would_find_it():
    rng = random.Random(0)
    pieces = ["<a>", "</a>", "x", " ", "<a", "a>", "</", "\n", "<b>", "</b>", "<A>"]
    for _ in range(20000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(0, 14)))
        assert extract_action(text, "a") == _regex(text, "a"), text
    assert extract_action("say <a> up </a> then <a>left</a>", "a") == "left"
    assert extract_action("  up ", "") == "up"


def test_a_million_unclosed_tags_are_read_in_one_scan():
    """The quadratic regex took 6.6 s on 10,000 openings, so this reply would take about 18 hours; a
    linear scan reads it at once (a regression here hangs the suite rather than passing)."""
    assert extract_action("<answer>" * 1_000_000, "answer") is None
    assert extract_action("<answer>" * 1_000_000 + "7</answer>", "answer") == "<answer>" * 999_999 + "7"
