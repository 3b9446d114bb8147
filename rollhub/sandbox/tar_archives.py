"""Tar archives for moving files in and out of containers (the Docker archive API speaks tar)."""

from __future__ import annotations

import io
import os
import posixpath
import tarfile
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import IO, Any

from rollhub.sandbox.base import FileTooLargeError


def require_absolute(path: str) -> str:
    if not posixpath.isabs(path):
        raise ValueError(f"sandbox paths must be absolute (got {path!r}); e.g. '/testbed/{path}'")
    return posixpath.normpath(path)


def relative_to(path: str, base: str) -> str:
    """`path` relative to the folder the archive is extracted in ('' when it is that folder)."""
    relative = posixpath.relpath(require_absolute(path), require_absolute(base))
    if relative == ".":
        return ""
    if relative.startswith(".."):
        raise ValueError(f"{path} is not under {base}")
    return relative


def single_file_tar(path: str, content: bytes, mode: int = 0o644, uid: int = 0, gid: int = 0, base: str = "/") -> bytes:
    """A tar holding one file at `path`, to be extracted in `base` (default '/'), owned by
    uid:gid (the engine keeps the owner in the header); missing parents are created, owned
    by root, on extract."""
    name = relative_to(path, base)
    if not name:
        raise IsADirectoryError(f"{path} is a folder, not a file")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo(name)
        info.size = len(content)
        info.mode = mode
        info.uid, info.gid = uid, gid
        info.mtime = int(time.time())
        archive.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def _as_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """Files land owned by root inside the sandbox, whatever their owner on the host."""
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def directory_tar(local_dir: str, dest: str, base: str = "/") -> IO[bytes]:
    """A tar of `local_dir`'s contents placed under `dest`, to be extracted in `base`
    (default '/'), spooled to disk when large. The caller closes the returned file."""
    if not os.path.isdir(local_dir):
        raise FileNotFoundError(f"copy_in source is not a directory: {local_dir}")
    prefix = relative_to(dest, base)
    spool = tempfile.SpooledTemporaryFile(max_size=32 * 1024 * 1024)
    with tarfile.open(fileobj=spool, mode="w") as archive:
        if prefix:
            archive.add(local_dir, arcname=prefix, recursive=True, filter=_as_root)
        else:  # dest is the base: add the children one by one
            for name in sorted(os.listdir(local_dir)):
                archive.add(os.path.join(local_dir, name), arcname=name, recursive=True, filter=_as_root)
    spool.seek(0)
    return spool


class _ChunkReader(io.RawIOBase):
    """A file-like view of an iterable of byte chunks, read on demand (never all at once)."""

    def __init__(self, chunks: Iterable[bytes]):
        self._chunks = iter(chunks)
        self._pending = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            try:
                self._pending = memoryview(next(self._chunks))
            except StopIteration:
                return 0
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size


def first_file_from_tar(chunks: Iterable[bytes], max_bytes: int | None = None, path: str = "") -> bytes:
    """Read the first regular file out of a tar stream given as an iterable of byte chunks,
    streaming: memory holds the file once, and a file over `max_bytes` (by its tar header)
    raises FileTooLargeError before its bytes are read."""
    with tarfile.open(fileobj=io.BufferedReader(_ChunkReader(chunks), 1 << 16), mode="r|") as archive:
        for member in archive:
            if member.isfile():
                if max_bytes is not None and member.size > max_bytes:
                    raise FileTooLargeError(path or "/" + member.name, member.size, max_bytes)
                extracted = archive.extractfile(member)
                assert extracted is not None
                return extracted.read()
            if member.isdir():
                raise IsADirectoryError(member.name)
    raise FileNotFoundError("archive holds no regular file")


_TMPFS_PAGE = 4096


@dataclass(frozen=True)
class RebasedTar:
    tmpfs_bytes: int  # about how many bytes its files take in a tmpfs
    uid: int  # owner and mode of the folder itself
    gid: int
    mode: int


def rebase_tar(chunks: Iterable[bytes], out: IO[bytes]) -> RebasedTar:
    """Copy the archive API's tar of a folder (entries `name/...`) to `out` with the folder's
    own name stripped (`name/a` -> `a`, the folder itself -> `.`), so it can be extracted
    in that folder. Returns the room it takes and the folder's own owner and mode."""
    tmpfs_bytes = 0
    root = (0, 0, 0o755)
    source = tarfile.open(fileobj=io.BufferedReader(_ChunkReader(chunks), 1 << 16), mode="r|")
    with source, tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as target:
        for member in source:
            _, _, rest = member.name.partition("/")
            member.name = rest or "."
            if not rest and member.isdir():
                root = (member.uid, member.gid, member.mode & 0o7777)
            if member.islnk():
                member.linkname = member.linkname.partition("/")[2]
            if member.isfile():
                tmpfs_bytes += -(-member.size // _TMPFS_PAGE) * _TMPFS_PAGE
                target.addfile(member, source.extractfile(member))
            else:
                tmpfs_bytes += _TMPFS_PAGE if member.issym() else 0
                target.addfile(member)
    return RebasedTar(tmpfs_bytes, *root)
