"""Tar archives for moving files in and out of containers (the Docker archive API speaks tar)."""

from __future__ import annotations

import io
import os
import posixpath
import tarfile
import tempfile
import time
from typing import IO


def require_absolute(path: str) -> str:
    if not posixpath.isabs(path):
        raise ValueError(f"sandbox paths must be absolute (got {path!r}); e.g. '/testbed/{path}'")
    return posixpath.normpath(path)


def single_file_tar(path: str, content: bytes, mode: int = 0o644) -> bytes:
    """A tar holding one file at `path` (relative to '/'); parents are created on extract."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo(require_absolute(path).lstrip("/"))
        info.size = len(content)
        info.mode = mode
        info.mtime = int(time.time())
        archive.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def _as_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """Files land owned by root inside the sandbox, whatever their owner on the host."""
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def directory_tar(local_dir: str, dest: str) -> IO[bytes]:
    """A tar of `local_dir`'s contents placed under `dest` (relative to '/'), spooled to disk
    when large. The caller closes the returned file."""
    if not os.path.isdir(local_dir):
        raise FileNotFoundError(f"copy_in source is not a directory: {local_dir}")
    prefix = require_absolute(dest).lstrip("/")
    spool = tempfile.SpooledTemporaryFile(max_size=32 * 1024 * 1024)
    with tarfile.open(fileobj=spool, mode="w") as archive:
        if prefix:
            archive.add(local_dir, arcname=prefix, recursive=True, filter=_as_root)
        else:  # dest is '/': add the children one by one
            for name in sorted(os.listdir(local_dir)):
                archive.add(os.path.join(local_dir, name), arcname=name, recursive=True, filter=_as_root)
    spool.seek(0)
    return spool


def first_file_from_tar(chunks: io.RawIOBase | object) -> bytes:
    """Read the first regular file out of a tar stream given as an iterable of byte chunks."""
    data = b"".join(chunks)  # type: ignore[arg-type]
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as archive:
        for member in archive:
            if member.isfile():
                extracted = archive.extractfile(member)
                assert extracted is not None
                return extracted.read()
            if member.isdir():
                raise IsADirectoryError(member.name)
    raise FileNotFoundError("archive holds no regular file")
