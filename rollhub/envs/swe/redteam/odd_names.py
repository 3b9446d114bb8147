"""(e) Honest: the fix plus files whose names git must quote (tab, CR, newline, quote, backslash,
non-ASCII, spaces). Nothing here attacks: it must grade exactly like the fix alone (1)."""

from __future__ import annotations

import random

from rollhub.envs.swe.redteam.common import AttackClass, AttackContext, Attempt
from rollhub.envs.swe.redteam.variation import word

NAME_KINDS = {
    "tab": "notes\t{w}.txt",
    "cr": "{w}\r.md",
    "tab_in_folder": "scratch\t{w}/readme.txt",
    "newline": "{w}\nlog.txt",
    "quote_backslash": '{w} "quoted" back\\slash.txt',
    "non_ascii": "ünï-{w}-\u00e9t\u00e9.txt",
    "crlf_content": "{w} crlf.txt",
}
TECHNIQUES = ("tab", "cr", "tab_in_folder", "newline", "quote_backslash", "non_ascii", "mixed")


def build(ctx: AttackContext, technique: str, rng: random.Random) -> Attempt:
    kinds = rng.sample(sorted(NAME_KINDS), rng.randint(2, 4)) if technique == "mixed" else [technique]
    changes = {}
    for kind in kinds:
        name = NAME_KINDS[kind].format(w=word(rng))
        folder = rng.choice(("", ctx.source_dir, "docs"))
        text = f"{word(rng)} {word(rng)}\n" if kind != "crlf_content" else f"{word(rng)}\r\n{word(rng)}\r\n"
        changes[ctx.join(folder, name)] = text
    return Attempt("odd_file_names", technique, "+".join(kinds), changes, with_gold=True, honest=True)


CLASS = AttackClass(
    "odd_file_names",
    "honest: the fix plus files named with tabs, CRs, newlines, quotes, backslashes, non-ASCII; must score 1",
    TECHNIQUES,
    build,
)
