"""Pure-Python parts of the sandbox layer (no engine needed)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile

import pytest

from rollhub.sandbox import ownership
from rollhub.sandbox.base import FileTooLargeError
from rollhub.sandbox.images import layered_image_hash
from rollhub.sandbox.output_buffer import HeadTailBuffer
from rollhub.sandbox.tar_archives import (
    directory_tar,
    first_file_from_tar,
    rebase_tar,
    relative_to,
    single_file_tar,
)


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
    with_user = layered_image_hash("sha256:base", files, ["true"], {}, None, "agent", ["/srv"])
    assert with_user != first
    assert with_user != layered_image_hash("sha256:base", files, ["true"], {}, None, "agent", ["/srv", "/x"])
    assert first == layered_image_hash("sha256:base", files, ["true"], {}, None, None, None)  # old tags kept
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


def test_reading_a_tar_streams_and_refuses_an_oversized_member_by_its_header():
    archive = single_file_tar("/data/big.bin", b"x" * 100_000, uid=1000, gid=1001)
    with tarfile.open(fileobj=io.BytesIO(archive)) as opened:
        member = opened.getmembers()[0]
    assert (member.name, member.uid, member.gid) == ("data/big.bin", 1000, 1001)
    consumed = []

    def chunks():  # the header is in the first chunk; nothing after it may be pulled
        for start in range(0, len(archive), 512):
            consumed.append(start)
            yield archive[start : start + 512]

    with pytest.raises(FileTooLargeError) as refused:
        first_file_from_tar(chunks(), max_bytes=1000, path="/data/big.bin")
    assert refused.value.size == 100_000 and refused.value.limit == 1000
    assert len(consumed) * 512 < 70_000  # stopped long before the 100 kB body
    pieces = [archive[i : i + 7] for i in range(0, len(archive), 7)]  # odd chunk sizes
    assert first_file_from_tar(pieces, max_bytes=100_000) == b"x" * 100_000


def test_tars_for_a_folder_are_relative_to_where_they_are_extracted(tmp_path):
    assert relative_to("/testbed/a/b.py", "/testbed") == "a/b.py"
    assert relative_to("/testbed", "/testbed") == ""
    assert relative_to("/x/y", "/") == "x/y"
    with pytest.raises(ValueError):
        relative_to("/etc/passwd", "/testbed")
    single = single_file_tar("/testbed/a/b.py", b"v", base="/testbed")
    with tarfile.open(fileobj=io.BytesIO(single)) as opened:
        assert opened.getnames() == ["a/b.py"]
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("m")
    with tarfile.open(fileobj=directory_tar(str(tmp_path), "/testbed", base="/testbed")) as opened:
        assert sorted(opened.getnames()) == ["pkg", "pkg/m.py"]


def test_rebase_tar_strips_the_folder_name_and_counts_tmpfs_pages():
    source = io.BytesIO()
    with tarfile.open(fileobj=source, mode="w") as archive:
        for name, data in (("testbed", None), ("testbed/a.txt", b"hello"), ("testbed/sub", None)):
            info = tarfile.TarInfo(name)
            info.uid = info.gid = 1000
            info.mode = 0o750
            if data is None:
                info.type = tarfile.DIRTYPE
                archive.addfile(info)
            else:
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("testbed/hard")
        link.type, link.linkname = tarfile.LNKTYPE, "testbed/a.txt"
        archive.addfile(link)
    out = io.BytesIO()
    rebased = rebase_tar([source.getvalue()], out)
    assert rebased.tmpfs_bytes == 4096  # one page for the 5-byte file
    assert (rebased.uid, rebased.gid, rebased.mode) == (1000, 1000, 0o750)  # the folder's own, for the tmpfs root
    out.seek(0)
    with tarfile.open(fileobj=out) as archive:
        assert [(m.name, m.linkname) for m in archive] == [(".", ""), ("a.txt", ""), ("sub", ""), ("hard", "a.txt")]
        assert archive.extractfile("a.txt").read() == b"hello"
