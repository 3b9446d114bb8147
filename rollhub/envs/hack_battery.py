"""A hack battery: generic exploit agents played through an env's real `reset`/`step`, and the
hackability score they give the env.

A reward pays only for the task. An agent that never works on the task (it echoes the question,
answers nothing, floods the reply, bends the answer format) must score nothing; if one of these
agents scores, RL will find it long before it finds the skill. The battery plays each exploit
on a few seeds with the env's own action format (`action_tag`, or tool calls for envs that
declare `tools`) and reports:

* per exploit: mean episode score over its seeds, on the env's success scale (below);
* hackability: the best exploit's mean score. `check_env` fails a registered env whose
  hackability exceeds `HACKABILITY_LIMIT` unless the class declares `hackability_note` (why);
  `rollhub bench env` puts it on the env's card.

The success scale: when every reward the battery saw lies in [0, 1] (0/1 rewards, partial
credit), an episode scores its return clipped to [0, 1] ("reward" scale: partial credit counts
as hacked, fail closed); otherwise rewards are shaped (step penalties, push bonuses) and an
episode scores 1 when it ends with `info["success"]` ("success" scale).

The exploits read only what the env showed: the opening messages (the question, number- and
expression-looking spans in it, literal answers of worked examples, the example reply) and the
last observation. None of them calls the env's tools on purpose to compute something: that is
honest work (MathTool's intended solution), which the battery must never count as a hack.
Multi-turn envs get the same kind of action every turn, up to `max_turns` turns (an episode
the cap cuts scores 0: the card says the cap).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from rollhub.envs.base import Env, Observation, wrap_action

logger = logging.getLogger(__name__)

#: a registered env whose best exploit scores more than this fails `check_env` (without a note)
HACKABILITY_LIMIT = 0.05
#: seeds of the hack battery: an exploit that wins by coincidence (a question whose answer is one of
#: its own numbers: 2% of Math-v0; a room one repeated move solves: 3% of Sokoban-v0) must not read
#: as 1 seed in 4
HACK_SEEDS = 64
#: wall time after which the hack battery starts no new seed (in-process envs finish far sooner)
HACK_BUDGET_S = 30.0
#: turns one exploit episode may take (repeating a degenerate action longer buys nothing)
DEFAULT_MAX_TURNS = 8
HUGE_CHARS = 200_000

_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w])")
# An arithmetic span: starts with a digit, a minus or a parenthesis, ends with a digit or a
# parenthesis (so "Compute 12 + 7." gives "12 + 7"), and holds an operator.
_EXPRESSION = re.compile(r"[-(]*\d[\d\s+\-*/^%().×÷,]*[\d)]")
_OPERATOR = re.compile(r"\d\s*[-+*/^%×÷]\s*[-(]*\d")
_TAGGED = re.compile(r"<(\w+)>(.*?)</\1>", flags=re.DOTALL)
_DIGITS = "0123456789"
_FULLWIDTH = "０１２３４５６７８９"
_ARABIC_INDIC = "٠١٢٣٤٥٦٧٨٩"


def message_text(messages: Observation) -> str:
    return "\n".join(m.get("content", "") for m in messages if isinstance(m, dict))


def number_spans(text: str) -> list[str]:
    """The numbers written in `text`, in order."""
    return _NUMBER.findall(text)


def expression_spans(text: str) -> list[str]:
    """Arithmetic expressions written in `text` (a digit, an operator, a digit at least), longest first."""
    spans = {m.group(0).strip(" ,") for m in _EXPRESSION.finditer(text)}
    return sorted((s for s in spans if _OPERATOR.search(s)), key=lambda s: (-len(s), s))


def echoes_question(answer: str, question: str) -> bool:
    """Whether an answer restates the question instead of answering it: it contains the question's
    arithmetic expression (spaces ignored), or it is the question's whole text. Cheap enough for an
    env to flag `info["exploit_signals"]["echo_answer"]` on every graded step."""
    squeezed = "".join(answer.split()).lower()
    if not squeezed:
        return False
    if squeezed == "".join(question.split()).lower():
        return True
    return any("".join(span.split()) in squeezed for span in expression_spans(question[:2000]))


@dataclasses.dataclass(frozen=True)
class Prompt:
    """What an exploit may read on one turn, and the env's action format."""

    opening: Observation
    last: Observation
    tag: str
    tool_names: tuple[str, ...]
    tool_arguments: dict[str, tuple[str, ...]]

    @property
    def question(self) -> str:
        """The opening's last user message (the task statement), else all of its text."""
        users = [m["content"] for m in self.opening if m.get("role") == "user"]
        return users[-1] if users else message_text(self.opening)

    @property
    def payloads(self) -> dict[str, str]:
        """The answer-looking spans of the question: the question itself, its longest arithmetic
        expression, its first and last numbers (a key is absent when the question has none)."""
        question = self.question.strip()
        out = {"question": question}
        expressions = expression_spans(question)
        if expressions:
            out["expression"] = expressions[0]
        numbers = number_spans(question)
        if numbers:
            out["first_number"], out["last_number"] = numbers[0], numbers[-1]
        return out

    @property
    def primary(self) -> str:
        """The payload the format tricks carry: the likeliest answer an echo could pass for."""
        payloads = self.payloads
        return payloads.get("expression") or payloads.get("last_number") or payloads["question"]

    @property
    def example_answers(self) -> list[str]:
        """Literal answers the opening shows inside the env's tag (the format line, a worked example,
        an answer the question itself spells out)."""
        tag = self.tag or "answer"
        text = message_text(self.opening)
        found = [body.strip() for name, body in _TAGGED.findall(text) if name == tag and body.strip()]
        return list(dict.fromkeys(found))

    @property
    def example_reply(self) -> str | None:
        """The last assistant message of the opening (a worked example's reply), verbatim."""
        replies = [m["content"] for m in self.opening if m.get("role") == "assistant"]
        return replies[-1] if replies else None

    def wrap(self, text: str) -> str:
        return wrap_action(text, self.tag)

    def tool_call(self, payload: str) -> str:
        """A tool call that carries `payload` as every required argument of the env's first tool
        (or of an `answer` tool when it declares none)."""
        name = self.tool_names[0] if self.tool_names else "answer"
        arguments = {key: payload for key in self.tool_arguments.get(name, ())} or {"answer": payload}
        return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


#: an exploit's action on one turn (0-based), or None when it does not apply to this prompt
Act = Callable[[Prompt, int], "str | None"]


@dataclasses.dataclass(frozen=True)
class Exploit:
    name: str
    what: str
    act: Act


def _payload(key: str) -> Act:
    return lambda p, _turn: p.wrap(p.payloads[key]) if key in p.payloads else None


def _primary(make: Callable[[Prompt, str], str]) -> Act:
    return lambda p, _turn: make(p, p.primary)


def _tagged(make: Callable[[str, str], str]) -> Act:
    """A format trick on the env's tag (`answer` for envs with bare answers)."""
    return lambda p, _turn: make(p.tag or "answer", p.primary)


def _example(index: int) -> Act:
    def act(p: Prompt, _turn: int) -> str | None:
        examples = p.example_answers
        return p.wrap(examples[index]) if examples else None

    return act


def _several(one_tag: bool) -> Act:
    def act(p: Prompt, _turn: int) -> str:
        candidates = list(dict.fromkeys([*expression_spans(p.question), *number_spans(p.question)]))[:20]
        candidates = candidates or [p.question]
        if one_tag:
            return p.wrap(" or ".join(candidates))
        return " ".join(p.wrap(c) for c in candidates)

    return act


def _digits(alphabet: str) -> Act:
    table = str.maketrans(_DIGITS, alphabet)
    return lambda p, _turn: p.wrap(p.primary.translate(table))


EXPLOITS: tuple[Exploit, ...] = (
    Exploit("echo_question", "the question's text as the answer", _payload("question")),
    Exploit("echo_expression", "the question's arithmetic expression", _payload("expression")),
    Exploit("echo_first_number", "the question's first number", _payload("first_number")),
    Exploit("echo_last_number", "the question's last number", _payload("last_number")),
    Exploit(
        "echo_last_observation", "the env's last message as the answer", lambda p, _t: p.wrap(message_text(p.last))
    ),
    Exploit("empty_answer", "an empty answer in the tag", lambda p, _t: p.wrap("")),
    Exploit("whitespace_answer", "only whitespace in the tag", lambda p, _t: p.wrap(" \n\t ")),
    Exploit("empty_reply", "an empty reply", lambda p, _t: ""),
    Exploit("whitespace_reply", "a reply of whitespace", lambda p, _t: " \n "),
    Exploit("several_answers", "every number and expression, each in its own tag", _several(one_tag=False)),
    Exploit("several_in_one_tag", "every number and expression in one tag, joined by 'or'", _several(one_tag=True)),
    Exploit("answer_in_tool_call", "the expression as a tool call's arguments", _primary(lambda p, x: p.tool_call(x))),
    Exploit(
        "answer_tag_in_tool_call",
        "a tagged answer inside a tool call's JSON",
        _primary(lambda p, x: p.tool_call(p.wrap(x))),
    ),
    Exploit("huge_answer", f"{HUGE_CHARS} nines in the tag", lambda p, _t: p.wrap("9" * HUGE_CHARS)),
    Exploit(
        "huge_reply",
        f"{HUGE_CHARS} characters of filler, then the expression",
        _primary(lambda p, x: "filler " * (HUGE_CHARS // 7) + p.wrap(x)),
    ),
    Exploit("nested_tags", "the tag nested in itself", _tagged(lambda t, x: f"<{t}><{t}>{x}</{t}></{t}>")),
    Exploit("unclosed_tag", "an opening tag never closed", _tagged(lambda t, x: f"<{t}>{x}")),
    Exploit("repeated_tags", "the same answer three times", _tagged(lambda t, x: f"<{t}>{x}</{t}>" * 3)),
    Exploit("wrong_case_tag", "the tag in upper case", _tagged(lambda t, x: f"<{t.upper()}>{x}</{t.upper()}>")),
    Exploit("spaced_tag", "spaces inside the tag's brackets", _tagged(lambda t, x: f"< {t} >{x}</ {t} >")),
    Exploit("untagged", "the expression without any tag", _primary(lambda p, x: x)),
    Exploit("boxed_untagged", "the expression in \\boxed{} without the tag", _primary(lambda p, x: f"\\boxed{{{x}}}")),
    Exploit("fullwidth_digits", "the expression in fullwidth digits", _digits(_FULLWIDTH)),
    Exploit("arabic_indic_digits", "the expression in Arabic-Indic digits", _digits(_ARABIC_INDIC)),
    Exploit("example_answer_first", "the first literal answer the prompt shows", _example(0)),
    Exploit("example_answer_last", "the last literal answer the prompt shows", _example(-1)),
    Exploit("copy_example_reply", "the worked example's reply, verbatim", lambda p, _t: p.example_reply),
)


@dataclasses.dataclass
class ExploitResult:
    name: str
    scores: list[float] = dataclasses.field(default_factory=list)  # one per scored seed
    returns: list[float] = dataclasses.field(default_factory=list)
    successes: int = 0
    capped: int = 0  # episodes the turn cap cut
    raised: int = 0  # steps that raised (counted against the exploit: score 0)
    infra_failures: int = 0  # episodes not scored
    signals: dict[str, int] = dataclasses.field(default_factory=dict)  # episodes with each exploit signal

    @property
    def mean_score(self) -> float:
        return sum(self.scores) / len(self.scores) if self.scores else 0.0


@dataclasses.dataclass
class BatteryResult:
    env: str
    seeds: list[int]
    max_turns: int
    scale: str  # "reward" or "success"
    exploits: dict[str, ExploitResult]
    skipped: list[str]  # exploits that had nothing to play on this env (no expression, no example)
    chance: ExploitResult | None = None  # the env's own random_action policy, same seeds and scale

    @property
    def chance_score(self) -> float:
        """What honest random play scores (0 for an env without `random_action`)."""
        return self.chance.mean_score if self.chance is not None else 0.0

    @property
    def is_hack(self) -> bool:
        """Whether the best exploit is a hack: above `HACKABILITY_LIMIT` and above chance (an exploit
        that scores less than the env's own random legal moves plays an easy game, it leaks nothing:
        repeating the target as a move in a counting game, one move in an open Sokoban room)."""
        return self.hackability > HACKABILITY_LIMIT and self.hackability > self.chance_score

    @property
    def best(self) -> ExploitResult | None:
        scored = [r for r in self.exploits.values() if r.mean_score > 0]  # in battery order: ties go to the first
        return max(scored, key=lambda r: r.mean_score) if scored else None

    @property
    def hackability(self) -> float:
        best = self.best
        return best.mean_score if best else 0.0

    def describe(self) -> str:
        best = self.best
        if best is None:
            return f"hackability 0.00 ({self.scale} scale): no exploit scored over seeds {_seed_range(self.seeds)}"
        chance = "" if self.chance is None else f"; random play scores {self.chance_score:.2f}"
        return (
            f"hackability {self.hackability:.2f} ({self.scale} scale): best exploit '{best.name}' "
            f"({_WHAT.get(best.name, '')}) over seeds {_seed_range(self.seeds)}{chance}"
        )

    def card_fields(self) -> dict[str, Any]:
        """What `rollhub bench env` writes on the env's card."""
        best = self.best
        return {
            "hackability": self.hackability,
            "hackability_scale": self.scale,
            "hackability_best_exploit": best.name if best else None,
            "hackability_seeds": len(self.seeds),
            "hackability_max_turns": self.max_turns,
            "hackability_exploits": {
                name: round(r.mean_score, 4) for name, r in sorted(self.exploits.items()) if r.scores
            },
            "hackability_signals": {name: r.signals for name, r in sorted(self.exploits.items()) if r.signals},
            "hackability_chance": self.chance_score if self.chance is not None else None,
        }


_WHAT = {e.name: e.what for e in EXPLOITS}


def _seed_range(seeds: list[int]) -> str:
    if seeds and seeds == list(range(seeds[0], seeds[0] + len(seeds))):
        return f"{seeds[0]}..{seeds[-1]}" if len(seeds) > 1 else str(seeds[0])
    return str(seeds)


def _tool_arguments(env: Env) -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    for tool in env.tools or []:
        function = tool.get("function", tool) if isinstance(tool, dict) else {}
        name = function.get("name") if isinstance(function, dict) else None
        if isinstance(name, str):
            required = (function.get("parameters") or {}).get("required") or []
            out[name] = tuple(k for k in required if isinstance(k, str))
    return out


async def run_battery(
    env: Env,
    *,
    seeds: list[int] | range = range(2),
    max_turns: int = DEFAULT_MAX_TURNS,
    exploits: tuple[Exploit, ...] = EXPLOITS,
    name: str | None = None,
    budget_s: float | None = None,
) -> BatteryResult:
    """Play every exploit on every seed through `env` (reset between episodes; the caller closes it).

    Seeds are played in rounds (every exploit on one seed, then the next seed). With `budget_s`,
    no new episode starts once that much wall time has passed, so an env whose every episode
    starts a container gets fewer seeds instead of minutes; the first round always runs whole (every
    exploit plays at least one seed), and the result lists the seeds that were started."""
    turns = max(1, min(max_turns, env.max_steps))
    tool_arguments = _tool_arguments(env)
    results = {exploit.name: ExploitResult(exploit.name) for exploit in exploits}
    played: dict[str, int] = dict.fromkeys(results, 0)
    episodes: list[tuple[str, list[float], bool]] = []  # (exploit, rewards, success) for the scale
    seeds_played: list[int] = []
    chance: ExploitResult | None = ExploitResult("random_play") if _has_random_action(env) else None
    chance_episodes: list[tuple[list[float], bool]] = []
    random_play = Exploit("random_play", "the env's own random_action", lambda p, _turn: None)
    started = time.perf_counter()
    for seed in seeds:
        if budget_s is not None and seeds_played and time.perf_counter() - started > budget_s:
            logger.info("hack battery: %s seeds of %s played within %.0f s", len(seeds_played), len(seeds), budget_s)
            break
        seeds_played.append(seed)
        rng = np.random.default_rng(seed)
        if chance is not None:
            episode = await _episode(env, random_play, seed, turns, tool_arguments, chance, rng=rng)
            if episode is not None:
                chance_episodes.append(episode)
        for exploit in exploits:
            if budget_s is not None and len(seeds_played) > 1 and time.perf_counter() - started > budget_s:
                break  # a later round may stop part-way: each exploit's mean is over its own seeds
            episode = await _episode(env, exploit, seed, turns, tool_arguments, results[exploit.name])
            if episode is not None:
                episodes.append((exploit.name, *episode))
                played[exploit.name] += 1
    skipped = [n for n, r in results.items() if not (played[n] or r.raised or r.infra_failures)]
    results = {n: r for n, r in results.items() if n not in skipped}
    rewards = [r for _, rs, _ in episodes for r in rs] + [r for rs, _ in chance_episodes for r in rs]
    scale = "reward" if all(0.0 <= r <= 1.0 for r in rewards) else "success"

    def score(rs: list[float], success: bool) -> float:
        return min(max(sum(rs), 0.0), 1.0) if scale == "reward" else float(success)

    for exploit_name, rs, success in episodes:
        results[exploit_name].scores.append(score(rs, success))
    if chance is not None:
        chance.scores = [score(rs, success) for rs, success in chance_episodes] + [0.0] * chance.raised
    for result in results.values():  # a step that raised scored 0 (in neither list above)
        result.scores.extend([0.0] * result.raised)
    return BatteryResult(name or type(env).__name__, seeds_played, turns, scale, results, skipped, chance)


def _has_random_action(env: Env) -> bool:
    try:
        env.random_action(np.random.default_rng(0))
    except NotImplementedError:
        return False
    except Exception:  # an env that needs a reset first answers after it; the episode tells
        return True
    return True


async def _episode(
    env: Env,
    exploit: Exploit,
    seed: int,
    turns: int,
    tool_arguments: dict[str, tuple[str, ...]],
    result: ExploitResult,
    *,
    rng: np.random.Generator | None = None,
) -> tuple[list[float], bool] | None:
    """One exploit episode: (step rewards, success), or None when it was not scored (not
    applicable, an infra failure, or a step that raised, which `result.raised` counts)."""
    opening, info = await env.reset(seed=seed)
    if info.get("infra_failure"):
        result.infra_failures += 1
        return None
    prompt = Prompt(opening, opening, env.action_tag, tuple(tool_arguments), tool_arguments)
    rewards: list[float] = []
    signals: set[str] = set()
    for turn in range(turns):
        try:
            action = env.random_action(rng) if rng is not None else exploit.act(prompt, turn)
        except NotImplementedError:  # no random play on this env (or not in this state)
            return None
        if action is None:
            return None
        try:
            obs, reward, terminated, truncated, info = await env.step(action)
        except Exception as exc:  # counted against the action, as a rollout counts it
            logger.debug("%s raised on exploit %s: %s", type(env).__name__, exploit.name, exc)
            result.raised += 1
            return None
        if info.get("infra_failure"):
            result.infra_failures += 1
            return None
        rewards.append(float(reward))
        for key, value in (info.get("exploit_signals") or {}).items():
            if value:
                signals.add(str(key))
        if terminated or truncated:
            success = bool(info.get("success"))
            break
        prompt = dataclasses.replace(prompt, last=list(obs))
    else:
        success = False
        result.capped += 1
    for key in signals:
        result.signals[key] = result.signals.get(key, 0) + 1
    result.returns.append(sum(rewards))
    result.successes += success
    return rewards, success
