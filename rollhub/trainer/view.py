"""`rollhub view RUN`: read trajectories as a static HTML page or as terminal text.

The page is one self-contained file (no scripts, no network): a summary table and, per
trajectory, each turn's observation, the model's raw answer, reward, validity and the
policy versions its tokens came from, so staleness is visible where it happened.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rollhub.core.errors import UserError
from rollhub.rollout.trajectory_log import RUN_TRAJECTORY_LOG


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


def render_text(path: Path, *, limit: int = 20, only: str | None = None) -> str:
    lines = []
    for record in _records(path, limit, only):
        lines.append(
            f"=== {record.get('trajectory_id', '?')}  env={record.get('env_id')} seed={record.get('seed')} "
            f"status={record.get('status')} success={record.get('success')} return={record.get('total_reward', 0):.2f}"
        )
        for index, turn in _turns(record):
            valid = "ok" if turn.get("action_valid", True) else "INVALID"
            lines.append(
                f"  [{index}] v{_versions(turn)} {valid} r={turn.get('reward', 0):+.2f}  "
                f"{turn.get('response_text', '')!r}"
            )
            obs = _observation_text(turn)
            if obs:
                lines.extend("      " + row for row in obs.splitlines())
    return "\n".join(lines) if lines else "(no trajectories)"


_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse}td,th{padding:2px 8px;border-bottom:1px solid #ddd;text-align:left}
details{margin:.4em 0;border:1px solid #ccc;border-radius:4px;padding:.3em .6em}
summary{cursor:pointer}.ok{color:#176f2c}.bad{color:#a31515}
pre{background:#f6f6f6;padding:.4em;margin:.2em 0;white-space:pre-wrap}
.turn{margin:.4em 0 .8em 1em}
"""


def render_html(path: Path, out: Path, *, limit: int = 200, only: str | None = None) -> int:
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
        body = []
        for index, turn in _turns(record):
            valid = (
                "<span class='ok'>valid</span>"
                if turn.get("action_valid", True)
                else "<span class='bad'>invalid</span>"
            )
            body.append(
                f"<div class='turn'><b>turn {index}</b> reward {turn.get('reward', 0):+.2f}, {valid}, "
                f"policy version {_versions(turn)}"
                f"<pre>{html.escape(turn.get('response_text', ''))}</pre>"
                f"<pre>{html.escape(_observation_text(turn))}</pre></div>"
            )
        parts.append(f"<details><summary>{head}</summary>{''.join(body)}</details>")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(parts), encoding="utf-8")
    return len(records)
