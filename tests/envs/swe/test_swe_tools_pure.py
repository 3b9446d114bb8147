"""Tool-argument validation that needs no container: what the model writes in a tool call
must become a tool error (the episode goes on), never an exception out of env.step."""

import json
import math

import pytest

from rollhub.envs.swe.agent.tools import MAX_COMMAND_BYTES, ToolError, _resolve, _timeout, parse_tool_call


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, -1, 0, 0.0, True, "10", [5], {"s": 1}])
def test_bad_timeouts_are_tool_errors(bad):
    with pytest.raises(ToolError, match="timeout_s"):
        _timeout(bad, 60.0, 300.0)


def test_timeouts_default_and_cap_even_for_huge_integers():
    assert _timeout(None, 60.0, 300.0) == 60.0
    assert _timeout(5, 60.0, 300.0) == 5.0
    assert _timeout(10**400, 60.0, 300.0) == 300.0  # float(10**400) would raise OverflowError
    assert _timeout(1e308, 60.0, 300.0) == 300.0


def test_nan_survives_json_and_is_still_refused():
    call = parse_tool_call('{"name": "bash", "arguments": {"command": "ls", "timeout_s": NaN}}')
    assert math.isnan(call.arguments["timeout_s"])
    with pytest.raises(ToolError):
        _timeout(call.arguments["timeout_s"], 60.0, 300.0)


def test_deeply_nested_json_and_bad_paths_are_tool_errors():
    with pytest.raises(ToolError, match="nests too deeply"):
        parse_tool_call("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ToolError):
        parse_tool_call(json.dumps({"name": "bash", "arguments": "[" * 100_000}))
    for path in ("", "a\0b", "\ud800.py"):
        with pytest.raises(ToolError):
            _resolve(path)
    assert _resolve("pkg/../x.py") == "/testbed/x.py" and MAX_COMMAND_BYTES < 128 * 1024
