"""`rollhub view RUN`: read trajectories as a static HTML page or as terminal text.

The page is one self-contained file (no scripts, no network): a summary table and, per
trajectory, its task, each turn's observation, the model's raw answer, reward, validity and
the policy versions its tokens came from, so staleness is visible where it happened.

The task is not stored as text: a trajectory keeps the ids of each prompt exactly as the
engine saw them (rollhub.rollout.types), and the env's opening messages live only there. So
each turn shows what its prompt added, decoded with the run's tokenizer: turn 0's is the task
(system prompt and first observation, in the chat template's markup, as the model saw it),
later turns' the env's replies. The tokenizer is the run's own: `--tokenizer DIR`, else the
run's final_model/, sft_model/ or its recipe's model.path, whichever holds one.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rollhub.core.errors import UserError
from rollhub.rollout.trajectory_log import RUN_TRAJECTORY_LOG

#: files one of which a folder holding a transformers tokenizer has
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
NO_TOKENIZER = "(the task is stored as token ids: pass --tokenizer MODEL_DIR to decode it)"


def find_trajectory_file(run: Path) -> Path:
    if run.is_file():
        return run
    candidate = run / RUN_TRAJECTORY_LOG
    if candidate.is_file():
        return candidate
    raise UserError(
        f"no trajectories found at {run}: expected a run folder with trajectories.jsonl "
        "(train.log_trajectories: true) or a .jsonl file"
    )


def find_tokenizer_dir(source: Path, given: Path | None = None) -> Path | None:
    """The folder of the tokenizer the run at `source` (its trajectory file) generated with, or None."""
    if given is not None:
        if not any((given / name).is_file() for name in TOKENIZER_FILES):
            raise UserError(f"--tokenizer {given}: no tokenizer there (expected one of {', '.join(TOKENIZER_FILES)})")
        return given
    run = source.parent
    candidates = [run / "final_model", run / "sft_model"]
    try:
        model_path = json.loads((run / "config.json").read_text(encoding="utf-8"))["model"]["path"]
        candidates.append(Path(model_path))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return next((c for c in candidates if any((c / name).is_file() for name in TOKENIZER_FILES)), None)


def load_tokenizer(folder: Path | None) -> Any:
    if folder is None:
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def _shown(record: dict[str, Any], tokenizer: Any) -> list[str | None]:
    """Per turn, the text its prompt added to the previous turn's prompt and answer (the whole
    prompt where a history window cut it), decoded; None per turn without a tokenizer."""
    turns = record.get("turns", [])
    if tokenizer is None:
        return [None] * len(turns)
    shown, previous = [], []
    for turn in turns:
        prompt = list(turn.get("prompt_ids") or [])
        new = prompt[len(previous) :] if previous and prompt[: len(previous)] == previous else prompt
        shown.append(tokenizer.decode(new, skip_special_tokens=False))
        previous = prompt + list(turn.get("response_ids") or [])
    return shown


def task_text(record: dict[str, Any], tokenizer: Any) -> str | None:
    """The episode's task as the model read it: turn 0's prompt, decoded (None without a tokenizer or turns)."""
    turns = record.get("turns", [])
    if tokenizer is None or not turns:
        return None
    return tokenizer.decode(turns[0].get("prompt_ids") or [], skip_special_tokens=False)


def _records(path: Path, limit: int, only: str | None) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line from a killed run
            if only == "success" and not record.get("success"):
                continue
            if only == "failure" and record.get("success"):
                continue
            records.append(record)
    return records[-limit:] if limit > 0 else records


def _turns(record: dict[str, Any]) -> Iterator[tuple[int, dict[str, Any]]]:
    yield from enumerate(record.get("turns", []))


def _observation_text(turn: dict[str, Any]) -> str:
    return "\n".join(m.get("content", "") for m in turn.get("observation", []))


def _versions(turn: dict[str, Any]) -> str:
    versions = turn.get("token_versions") or []
    if not versions:
        return "-"
    low, high = min(versions), max(versions)
    return str(low) if low == high else f"{low}..{high}"


def render_text(path: Path, *, limit: int = 20, only: str | None = None, tokenizer: Any = None) -> str:
    lines = []
    for record in _records(path, limit, only):
        lines.append(
            f"=== {record.get('trajectory_id', '?')}  env={record.get('env_id')} seed={record.get('seed')} "
            f"status={record.get('status')} success={record.get('success')} return={record.get('total_reward', 0):.2f}"
        )
        shown = _shown(record, tokenizer)
        if tokenizer is None:
            lines.append("  " + NO_TOKENIZER)
        for index, turn in _turns(record):
            if shown[index]:
                label = "task" if index == 0 else "shown"
                lines.append(f"  [{index}] {label}:")
                lines.extend("      " + row for row in shown[index].splitlines())
            valid = "ok" if turn.get("action_valid", True) else "INVALID"
            lines.append(
                f"  [{index}] v{_versions(turn)} {valid} r={turn.get('reward', 0):+.2f}  "
                f"{turn.get('response_text', '')!r}"
            )
            obs = _observation_text(turn)
            if obs and (tokenizer is None or index == len(shown) - 1):  # else the next turn shows it
                lines.extend("      " + row for row in obs.splitlines())
    return "\n".join(lines) if lines else "(no trajectories)"


_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse}td,th{padding:2px 8px;border-bottom:1px solid #ddd;text-align:left}
details{margin:.4em 0;border:1px solid #ccc;border-radius:4px;padding:.3em .6em}
summary{cursor:pointer}.ok{color:#176f2c}.bad{color:#a31515}
pre{background:#f6f6f6;padding:.4em;margin:.2em 0;white-space:pre-wrap}
.turn{margin:.4em 0 .8em 1em}
pre.task,pre.shown{background:#eef3fb}span.task{color:#555}
"""


def _snippet(task: str, tokenizer: Any, width: int = 90) -> str:
    """The end of the task, where the first observation is, in one short line."""
    plain = " ".join(task.split())
    for token in getattr(tokenizer, "all_special_tokens", []) or []:
        plain = plain.replace(token, " ")
    plain = " ".join(plain.split())
    return plain if len(plain) <= width else "..." + plain[-width:]


def render_html(path: Path, out: Path, *, limit: int = 200, only: str | None = None, tokenizer: Any = None) -> int:
    records = _records(path, limit, only)
    successes = sum(1 for r in records if r.get("success"))
    parts = [
        f"<!doctype html><meta charset='utf-8'><title>rollhub trajectories</title><style>{_STYLE}</style>",
        f"<h1>Trajectories</h1><p>{html.escape(str(path))}: showing {len(records)}, "
        f"{successes} successful ({100 * successes / max(len(records), 1):.0f}%).</p>",
    ]
    for record in records:
        cls = "ok" if record.get("success") else "bad"
        head = (
            f"<span class='{cls}'>{'success' if record.get('success') else 'failure'}</span> "
            f"{html.escape(str(record.get('trajectory_id', '')))} &middot; {html.escape(str(record.get('env_id')))} "
            f"seed {record.get('seed')} &middot; {len(record.get('turns', []))} turns &middot; "
            f"return {record.get('total_reward', 0):.2f} "
            f"&middot; {html.escape(str(record.get('status')))}"
        )
        shown = _shown(record, tokenizer)
        task = task_text(record, tokenizer)
        if task is not None:
            head += f" &middot; <span class='task'>{html.escape(_snippet(task, tokenizer))}</span>"
        body = [
            f"<div class='turn'><b>task</b><pre class='task'>{html.escape(task)}</pre></div>"
            if task is not None
            else f"<p>{html.escape(NO_TOKENIZER)}</p>"
        ]
        for index, turn in _turns(record):
            valid = (
                "<span class='ok'>valid</span>"
                if turn.get("action_valid", True)
                else "<span class='bad'>invalid</span>"
            )
            seen = shown[index] if index > 0 else None  # turn 0's is the task, shown above
            obs = _observation_text(turn)
            last = index == len(shown) - 1
            body.append(
                f"<div class='turn'><b>turn {index}</b> reward {turn.get('reward', 0):+.2f}, {valid}, "
                f"policy version {_versions(turn)}"
                + (f"<pre class='shown'>{html.escape(seen)}</pre>" if seen else "")
                + f"<pre>{html.escape(turn.get('response_text', ''))}</pre>"
                + (f"<pre>{html.escape(obs)}</pre>" if obs and (tokenizer is None or last) else "")
                + "</div>"
            )
        parts.append(f"<details><summary>{head}</summary>{''.join(body)}</details>")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(parts), encoding="utf-8")
    return len(records)
