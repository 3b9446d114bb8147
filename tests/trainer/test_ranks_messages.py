"""Rank control messages (rollhub.trainer.ranks.group): a payload every rank gets alike is pickled
once and broadcast (a checkpoint's full state must not be staged world_size times), per-rank
payloads still reach only their rank, and messages travel on a gloo group. Two real processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    sys.path.insert(0, sys.argv[1])
    import torch.distributed as dist
    import counted
    from rollhub.trainer.ranks.group import RankGroup, init_ranks

    group = RankGroup(init_ranks("gloo", 60.0, "cpu"))
    backend = dist.get_backend(getattr(group, "control_group", None))
    if group.context.is_leader:
        payload = (counted.Counted(), {"w": list(range(1000))})
        mine = group.announce("load", [payload] * group.world_size)
        assert mine is payload
        part = group.announce("prox", ["for-0", "for-1"])
        gathered = group._gather("from-0")
        group.announce("stop")
        print(json.dumps({"pickles": counted.PICKLES, "part": part, "gathered": gathered, "backend": backend}))
    else:
        command, payload = group._receive()
        assert command == "load" and payload[1]["w"][-1] == 999, payload
        command, part = group._receive()
        assert (command, part) == ("prox", "for-1"), (command, part)
        group._gather("from-1")
        assert group._receive()[0] == "stop"
    dist.destroy_process_group()
    """
)

COUNTED = textwrap.dedent(
    """
    PICKLES = 0


    class Counted:
        def __reduce__(self):
            global PICKLES
            PICKLES += 1
            return (Counted, ())
    """
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_payload_for_every_rank_is_pickled_once_and_per_rank_parts_reach_their_rank(tmp_path):
    (tmp_path / "counted.py").write_text(COUNTED)
    script = tmp_path / "ranks.py"
    script.write_text(SCRIPT)
    port = _free_port()
    processes = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2"}
        env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        command = [sys.executable, str(script), str(tmp_path)]
        processes.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = [p.communicate(timeout=120) for p in processes]
    for process, (_, err) in zip(processes, outputs):
        assert process.returncode == 0, err[-3000:]
    result = json.loads(outputs[0][0].strip().splitlines()[-1])
    assert result["pickles"] == 1  # broadcast once, not one pickled copy per rank
    assert result["part"] == "for-0" and result["gathered"] == ["from-0", "from-1"]
    assert result["backend"] == "gloo"


def test_one_named_gpu_for_several_ranks_is_refused_before_any_cuda_call(monkeypatch):
    import pytest

    from rollhub.core.errors import UserError
    from rollhub.trainer.ranks.group import init_ranks

    env = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(UserError, match="model.device=cuda:3 with 2 trainer ranks"):
        init_ranks("auto", 5.0, "cuda:3")


def test_the_side_group_waits_as_long_as_the_default_group(monkeypatch):
    """Under NCCL the control messages travel on a gloo side group; torch gives a new group 30 minutes
    unless told otherwise, shorter than a rank-0-only phase (SFT, a long reading), so it must get the
    run's collective timeout. A one-rank gloo group stands in for the NCCL default (no GPU here)."""
    from datetime import timedelta

    import torch.distributed as dist

    from rollhub.trainer.ranks import group as ranks_group

    created = []
    real_new_group = dist.new_group

    def recording_new_group(*args, **kwargs):
        created.append(kwargs)
        return real_new_group(*args, **kwargs)

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        monkeypatch.setattr(dist, "get_backend", lambda *a, **k: "nccl")
        monkeypatch.setattr(dist, "new_group", recording_new_group)
        side = ranks_group.control_group(7200.0)
        assert side is not None
        assert created == [{"backend": "gloo", "timeout": timedelta(seconds=7200.0)}]
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
