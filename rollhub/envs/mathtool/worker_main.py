"""The tool worker process: runs the bounded interpreter on requests read from stdin.

Started by `tool_worker.ToolWorker` as `python -I -S worker_main.py`: isolated (no environment
variables, no site packages, nothing of the trainer's process) and limited before it reads a
request (address space, no core files, no new files), so a program that slipped past every cap
of the interpreter costs at most this process, which the parent kills and replaces. The
interpreter is loaded from its file (stdlib only), not through the `rollhub` package, which
would import far more than a worker needs and make it start slowly.

Protocol: one JSON object per line each way; the first line out is `READY`. Request: {"op":
"python" | "calculator", "source", "time_limit_s", "max_output_chars"}; reply: {"output", "error",
"truncated", "steps"}.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

READY = b'{"ready": true}\n'


def _limit(memory_mb: int) -> None:
    import resource

    memory = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))


def _interpreter():  # noqa: ANN202 - a module loaded from its path
    spec = importlib.util.spec_from_file_location(
        "rollhub_tool_interpreter", Path(__file__).with_name("interpreter.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def main() -> None:
    interpreter = _interpreter()
    _limit(int(sys.argv[1]) if len(sys.argv) > 1 else 256)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    stdout.write(READY)  # loaded and limited: the parent starts sending requests
    stdout.flush()
    for line in stdin:
        try:
            request = json.loads(line)
            if request["op"] == "calculator":
                result = interpreter.evaluate_expression(request["source"], time_limit_s=request["time_limit_s"])
            else:
                result = interpreter.run_code(
                    request["source"],
                    time_limit_s=request["time_limit_s"],
                    max_output_chars=request["max_output_chars"],
                )
            reply = {
                "output": result.output,
                "error": result.error,
                "truncated": result.truncated,
                "steps": result.steps,
            }
        except MemoryError:
            reply = {
                "output": "",
                "error": "MemoryError: the program ran out of memory",
                "truncated": False,
                "steps": 0,
            }
        except (ValueError, KeyError, TypeError) as exc:  # a malformed request: the parent's bug, said plainly
            reply = {"output": "", "error": f"RuntimeError: bad tool request ({exc})", "truncated": False, "steps": 0}
        stdout.write(json.dumps(reply).encode("utf-8") + b"\n")
        stdout.flush()
    os._exit(0)  # stdin closed: the parent is gone or done


if __name__ == "__main__":
    main()
