"""The SWE agent's tools: JSON-schema declarations and their implementation on a sandbox.

`bash` runs one command in a fresh `bash -c` inside /testbed (state lives in the files,
not in a shell), with a per-command timeout and head+tail truncated output.
`str_replace_editor` views, creates and edits files (view / create / str_replace / insert),
the editor SWE-agent and OpenHands made standard. `submit` ends the episode; the env then
grades the diff in a fresh container.

The engine's archive API reads and writes as root whoever the sandbox's user is, so the
editor reads only what that user may read and writes through the user's own `cat` (the
text is staged under a random name in /tmp): a file the user cannot write (the venv, the
system) stays unwritable through the editor too.
"""

from __future__ import annotations

import json
import math
import posixpath
import secrets
import shlex
from dataclasses import dataclass
from typing import Any

from rollhub.envs.swe.tasks import WORKDIR
from rollhub.sandbox.base import Sandbox, truncate_middle

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a bash command in the repository root (/testbed). Each call is a fresh shell; "
            "long output keeps its head and tail. Use it to explore, run tests and scripts.",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "the command line"},
                    "timeout_s": {
                        "type": "integer",
                        "description": "seconds before the command is killed (default 60)",
                        "minimum": 1,
                    },
                },
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "str_replace_editor",
            "description": "View, create and edit files. view: a file with line numbers (optionally view_range "
            "[first, last]) or a directory listing; create: write file_text to a new path; str_replace: replace "
            "old_str, which must occur exactly once, by new_str; "
            "insert: insert new_str after line insert_line (0 = top).",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "string", "enum": ["view", "create", "str_replace", "insert"]},
                    "path": {"type": "string", "description": "absolute, or relative to /testbed"},
                    "file_text": {"type": "string"},
                    "old_str": {"type": "string"},
                    "new_str": {"type": "string"},
                    "insert_line": {"type": "integer", "minimum": 0},
                    "view_range": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2},
                },
                "required": ["command", "path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "submit",
            "description": "Submit your changes to the repository as the final answer; "
            "the episode ends and hidden tests grade it.",
            "parameters": {"type": "object", "properties": {}},
        },
    },
]
TOOL_NAMES = tuple(t["function"]["name"] for t in TOOLS)


class ToolError(ValueError):
    """The call was well-formed JSON but not a valid use of a tool (the reply says why)."""


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]

    def to_text(self) -> str:
        return "<tool_call>" + json.dumps({"name": self.name, "arguments": self.arguments}) + "</tool_call>"


def parse_tool_call(payload: str) -> ToolCall:
    """`{"name": ..., "arguments": {...}}` -> ToolCall; ToolError says what is wrong."""
    try:
        data = json.loads(payload)
    except json.JSONDecodeError as exc:
        raise ToolError(f"the tool call is not valid JSON ({exc.msg} at char {exc.pos})") from None
    except RecursionError:
        raise ToolError("the tool call nests too deeply") from None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        raise ToolError('a tool call is {"name": <tool>, "arguments": {...}}')
    arguments = data.get("arguments", {})
    if isinstance(arguments, str):  # some chat templates emit the arguments JSON-encoded
        try:
            arguments = json.loads(arguments)
        except (json.JSONDecodeError, RecursionError):
            raise ToolError("arguments must be a JSON object") from None
    if not isinstance(arguments, dict):
        raise ToolError("arguments must be a JSON object")
    if data["name"] not in TOOL_NAMES:
        raise ToolError(f"unknown tool '{data['name']}'; tools: {', '.join(TOOL_NAMES)}")
    return ToolCall(data["name"], arguments)


def _require(arguments: dict[str, Any], key: str, kind: type) -> Any:
    value = arguments.get(key)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
        raise ToolError(f"argument '{key}' ({kind.__name__}) is required")
    return value


#: one argv string of `docker exec` is limited by the kernel (MAX_ARG_STRLEN, 128 KiB)
MAX_COMMAND_BYTES = 100_000
#: files the editor reads whole into memory
MAX_EDITOR_FILE_BYTES = 5_000_000


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _resolve(path: str) -> str:
    if "\0" in path or not path.strip() or not _encodable(path):
        raise ToolError("path must be a non-empty string without NUL characters or unpaired surrogates")
    return posixpath.normpath(path if path.startswith("/") else posixpath.join(WORKDIR, path))


def _inside_repo(path: str) -> bool:
    return path == WORKDIR or path.startswith(WORKDIR + "/")


def _timeout(value: Any, default: float, cap: float) -> float:
    """A finite positive number of seconds, at most `cap`; ToolError for NaN, infinities, <= 0."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ToolError("timeout_s must be a positive number of seconds")
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolError(f"timeout_s must be a finite number of seconds, got {value}")
    if value <= 0:
        raise ToolError(f"timeout_s must be positive, got {value}")
    return float(min(value, cap))


class ToolRunner:
    """Executes tool calls in one sandbox; returns the observation text."""

    def __init__(
        self,
        box: Sandbox,
        command_timeout_s: float = 60.0,
        max_command_timeout_s: float = 300.0,
        output_limit_chars: int = 10_000,
    ):
        self.box = box
        self.command_timeout_s = command_timeout_s
        self.max_command_timeout_s = max_command_timeout_s
        self.output_limit_chars = output_limit_chars

    async def run(self, call: ToolCall) -> str:
        if call.name == "bash":
            return await self.bash(call.arguments)
        if call.name == "str_replace_editor":
            return await self.editor(call.arguments)
        raise ToolError(f"tool '{call.name}' is not run by the runner")

    async def bash(self, arguments: dict[str, Any]) -> str:
        command = _require(arguments, "command", str)
        if "\0" in command or not _encodable(command):
            raise ToolError("the command contains a NUL character or an unpaired surrogate")
        if len(command.encode("utf-8")) > MAX_COMMAND_BYTES:
            raise ToolError(
                f"the command is longer than {MAX_COMMAND_BYTES} bytes; write long texts with str_replace_editor create"
            )
        timeout_s = _timeout(arguments.get("timeout_s"), self.command_timeout_s, self.max_command_timeout_s)
        result = await self.box.exec(command, timeout_s=timeout_s, workdir=WORKDIR)
        output, _ = truncate_middle(result.output, self.output_limit_chars)
        if result.timed_out:
            return f"{output}\n[command timed out after {timeout_s:g} s and was killed]"
        return f"{output}\n[exit code {result.exit_code}]" if output else f"[exit code {result.exit_code}]"

    async def _real_path(self, path: str) -> str:
        """`path` with symlinks resolved; ToolError when a symlink leads out of the repository."""
        result = await self.box.exec(f"realpath -m -- {shlex.quote(path)}", timeout_s=10)
        real = result.output.strip()
        if result.exit_code != 0 or not real.startswith("/") or "\n" in real:
            raise ToolError(f"cannot resolve {path}")
        real = posixpath.normpath(real)
        if real != path and not _inside_repo(real):
            raise ToolError(f"{path} is a symbolic link to {real}, outside the repository {WORKDIR}; not followed")
        return real

    async def _read_text(self, path: str) -> str:
        quoted = shlex.quote(path)
        probe = await self.box.exec(f"test -f {quoted} && test -r {quoted} && stat -L -c %s {quoted}", timeout_s=10)
        if probe.exit_code != 0:
            raise ToolError(f"{path} is not a file you can read")
        size = probe.output.strip()
        if size.isdigit() and int(size) > MAX_EDITOR_FILE_BYTES:
            raise ToolError(f"{path} has {size} bytes; the editor opens files up to {MAX_EDITOR_FILE_BYTES}")
        try:
            data = await self.box.read_file(path)
        except (FileNotFoundError, IsADirectoryError, OSError, ValueError) as exc:
            raise ToolError(f"cannot read {path}: {exc}") from None
        return data.decode("utf-8", errors="replace")

    async def _write_text(self, path: str, text: str) -> None:
        """Stage the text, then let the sandbox's user copy it into place: the kernel decides
        whether that user may write `path` (and an edited file keeps its owner and mode)."""
        staged = f"/tmp/.rollhub-edit-{secrets.token_hex(8)}"
        try:
            await self.box.write_file(staged, text.encode("utf-8", "surrogatepass"))
        except (OSError, ValueError) as exc:
            raise ToolError(f"cannot write {path}: {exc}") from None
        quoted = shlex.quote(staged)
        result = await self.box.exec(
            f"cat {quoted} > {shlex.quote(path)}; rc=$?; rm -f {quoted}; exit $rc", timeout_s=30, workdir="/"
        )
        if result.exit_code != 0:
            detail = result.output.strip().splitlines()[-1:] or [f"exit code {result.exit_code}"]
            raise ToolError(f"cannot write {path}: {detail[0][-200:]}")

    async def editor(self, arguments: dict[str, Any]) -> str:
        command = _require(arguments, "command", str)
        path = await self._real_path(_resolve(_require(arguments, "path", str)))
        if command == "view":
            return await self._view(path, arguments.get("view_range"))
        if command == "create":
            text = _require(arguments, "file_text", str)
            exists = await self.box.exec(f"test -e {shlex.quote(path)}", timeout_s=10)
            if exists.exit_code == 0:
                raise ToolError(f"{path} already exists; use str_replace to edit it")
            await self.box.exec(f"mkdir -p {shlex.quote(posixpath.dirname(path))}", timeout_s=10)
            await self._write_text(path, text)
            return f"created {path} ({len(text.splitlines())} lines)"
        if command == "str_replace":
            old = _require(arguments, "old_str", str)
            new = arguments.get("new_str", "")
            if not isinstance(new, str):
                raise ToolError("new_str must be a string")
            text = await self._read_text(path)
            count = text.count(old) if old else 0
            if count != 1:
                raise ToolError(
                    f"old_str occurs {count} times in {path}; it must occur exactly once (add surrounding lines)"
                )
            start_line = text[: text.index(old)].count("\n") + 1
            text = text.replace(old, new, 1)
            await self._write_text(path, text)
            return f"edited {path}\n" + self._numbered(text, start_line - 3, start_line + new.count("\n") + 3)
        if command == "insert":
            line = _require(arguments, "insert_line", int)
            new = _require(arguments, "new_str", str)
            lines = (await self._read_text(path)).splitlines(keepends=True)
            if not 0 <= line <= len(lines):
                raise ToolError(f"insert_line must be between 0 and {len(lines)}")
            if lines and not lines[-1].endswith("\n") and line == len(lines):
                lines[-1] += "\n"
            lines[line:line] = [new if new.endswith("\n") else new + "\n"]
            text = "".join(lines)
            await self._write_text(path, text)
            return f"edited {path}\n" + self._numbered(text, line - 2, line + new.count("\n") + 3)
        raise ToolError(f"unknown editor command '{command}'; use view, create, str_replace or insert")

    async def _view(self, path: str, view_range: Any) -> str:
        kind = await self.box.exec(
            f"if test -d {shlex.quote(path)}; then echo dir; elif test -f {shlex.quote(path)}; then echo file; fi",
            timeout_s=10,
        )
        if kind.output.strip() == "dir":
            listing = await self.box.exec(
                f"find {shlex.quote(path)} -maxdepth 2 -not -path '*/.*' | sort", timeout_s=30
            )
            return truncate_middle(listing.output, self.output_limit_chars)[0]
        if kind.output.strip() != "file":
            raise ToolError(f"{path} does not exist")
        text = await self._read_text(path)
        first, last = 1, len(text.splitlines())
        if view_range is not None:
            if not (
                isinstance(view_range, list) and len(view_range) == 2 and all(isinstance(v, int) for v in view_range)
            ):
                raise ToolError("view_range is [first_line, last_line]")
            first, last = view_range[0], view_range[1] if view_range[1] != -1 else last
        return self._numbered(text, first, last)

    def _numbered(self, text: str, first: int, last: int) -> str:
        lines = text.splitlines()
        first = max(1, first)
        last = min(len(lines), last)
        body = "\n".join(f"{i:6d}\t{lines[i - 1]}" for i in range(first, last + 1))
        return truncate_middle(body, self.output_limit_chars)[0]
