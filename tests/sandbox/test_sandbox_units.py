"""Pure-Python parts of the sandbox layer (no engine needed)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile

import pytest

from rollhub.sandbox import ownership
from rollhub.sandbox.images import layered_image_hash
from rollhub.sandbox.output_buffer import HeadTailBuffer
from rollhub.sandbox.tar_archives import directory_tar, first_file_from_tar, single_file_tar


def test_head_tail_buffer_matches_plain_truncation_when_nothing_dropped():
    buffer = HeadTailBuffer(limit_chars=10)
    buffer.append(b"short")
    assert buffer.text() == ("short", False)


def test_head_tail_buffer_keeps_ends_of_a_long_stream_in_bounded_memory():
    buffer = HeadTailBuffer(limit_chars=100)
    buffer.append(b"BEGIN")
    for _ in range(10_000):
        buffer.append(b"x" * 1000)
    buffer.append(b"END")
    text, truncated = buffer.text()
    assert truncated
    assert text.startswith("BEGIN") and text.endswith("END")
    assert len(text) < 200
    assert len(buffer._head) + len(buffer._tail) <= 400  # never more than 2 x 2 x limit bytes
    dropped = int(text.split("[")[1].split()[0])
    assert dropped == buffer.total_bytes - 100


def test_head_tail_buffer_survives_multibyte_characters_at_the_edges():
    buffer = HeadTailBuffer(limit_chars=10)
    buffer.append("é".encode() * 1000)
    text, truncated = buffer.text()
    assert truncated and text.startswith("ééééé") and text.endswith("ééééé")


def test_owner_liveness_uses_pid_and_start_time():
    me = ownership.owner_labels("run-x")
    assert ownership.owner_is_alive(me)
    assert not ownership.owner_is_alive({**me, ownership.LABEL_OWNER_START: "1"})  # pid reused
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone_pid = finished.stdout.strip()
    assert not ownership.owner_is_alive({**me, ownership.LABEL_OWNER_PID: gone_pid})
    assert ownership.owner_is_alive(
        {**me, ownership.LABEL_HOST: "some-other-host", ownership.LABEL_OWNER_PID: gone_pid}
    )
    assert not ownership.owner_is_alive({**me, ownership.LABEL_OWNER_PID: "not-a-pid"})


def test_tar_helpers_round_trip(tmp_path):
    assert first_file_from_tar([single_file_tar("/a/b/c.txt", b"payload")]) == b"payload"
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "f.txt").write_text("f")
    spool = directory_tar(str(tmp_path), "/dest/dir")
    with tarfile.open(fileobj=io.BytesIO(spool.read())) as archive:
        names = sorted(archive.getnames())
        owners = {member.uid for member in archive.getmembers()}
    assert names == ["dest/dir", "dest/dir/sub", "dest/dir/sub/f.txt"]
    assert owners == {0}
    with pytest.raises(ValueError):
        single_file_tar("relative.txt", b"")


def test_layered_image_hash_tracks_every_input(tmp_path):
    source = tmp_path / "tree"
    source.mkdir()
    (source / "a.py").write_text("print(1)\n")
    files = {"/srv": str(source)}
    first = layered_image_hash("sha256:base", files, ["true"], {}, None)
    assert first == layered_image_hash("sha256:base", files, ["true"], {}, None)
    assert first != layered_image_hash("sha256:other", files, ["true"], {}, None)
    assert first != layered_image_hash("sha256:base", files, ["false"], {}, None)
    assert first != layered_image_hash("sha256:base", files, ["true"], {"A": "1"}, None)
    (source / "a.py").write_text("print(2)\n")
    assert first != layered_image_hash("sha256:base", files, ["true"], {}, None)
    os.chmod(source / "a.py", 0o755)
    changed_content = layered_image_hash("sha256:base", files, ["true"], {}, None)
    (source / "a.py").chmod(0o644)
    assert changed_content != layered_image_hash("sha256:base", files, ["true"], {}, None)


def test_sandbox_cli_reports_a_missing_engine_in_one_line(tmp_path):
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"}
    result = subprocess.run(
        [sys.executable, "-m", "rollhub.cli", "sandbox", "ls"], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "no Docker engine answers" in result.stderr
    assert "Traceback" not in result.stderr
