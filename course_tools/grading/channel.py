"""The one way results come back from a sandbox: a pipe with a size limit and a deadline.

The worker inside the sandbox sends named byte strings (its run report and each exercise's
outputs file) as frames: 2-byte name length, name, 8-byte data length, data. The grader reads at
most ``cap`` bytes before the deadline, then decodes and checks everything: whatever arrives is
untrusted, so a malformed stream only costs the submission that sent it. (No torch here: the
worker imports this module, and it should start fast.)
"""

from __future__ import annotations

import os
import select
import stat
import struct
import time
from subprocess import Popen

FILE_CAP = 16 * 2**20  # bytes per outputs file, before and after unpacking
MAX_FILES = 64
_HEAD = struct.Struct(">H")
_SIZE = struct.Struct(">Q")


def encode(files: dict[str, bytes]) -> bytes:
    out = bytearray()
    for name, data in files.items():
        raw = name.encode()
        out += _HEAD.pack(len(raw)) + raw + _SIZE.pack(len(data)) + data
    return bytes(out)


def decode(stream: bytes) -> dict[str, bytes]:
    """Frames back into named byte strings; a broken frame ends the stream (what came before stays)."""
    files: dict[str, bytes] = {}
    pos = 0
    while pos + _HEAD.size <= len(stream) and len(files) < MAX_FILES + 1:
        (length,) = _HEAD.unpack_from(stream, pos)
        name_end = pos + _HEAD.size + length
        if name_end + _SIZE.size > len(stream):
            break
        (size,) = _SIZE.unpack_from(stream, name_end)
        start = name_end + _SIZE.size
        if start + size > len(stream):
            break
        files[stream[pos + _HEAD.size:name_end].decode("utf-8", "replace")] = stream[start:start + size]
        pos = start + size
    return files


def read_regular(path: str, cap: int = FILE_CAP) -> bytes | None:
    """The bytes of ``path`` if it is a regular file of at most ``cap`` bytes (no links, pipes or
    devices: opening never blocks and never follows a link), else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > cap:
            return None
        data = os.read(fd, cap + 1)
        return data if len(data) <= cap else None
    finally:
        os.close(fd)


def send(fd: int, files: dict[str, bytes]) -> None:
    with os.fdopen(fd, "wb", closefd=True) as pipe:
        pipe.write(encode(files))


def collect(proc: Popen, fd: int, deadline: float, cap: int) -> tuple[bytes, bool]:
    """Read the pipe until end of stream or ``deadline`` (time.monotonic), keeping at most ``cap``
    bytes. Returns (bytes, ran past the deadline). The caller ends the sandbox afterwards."""
    chunks: list[bytes] = []
    kept = 0
    exited_at = None
    while True:
        now = time.monotonic()
        if now >= deadline:
            return b"".join(chunks), True
        if exited_at is None and proc.poll() is not None:
            exited_at = now
        if exited_at is not None and now - exited_at > 2:  # something still holds the pipe open
            return b"".join(chunks), False
        ready, _, _ = select.select([fd], [], [], min(deadline - now, 0.5))
        if not ready:
            continue
        data = os.read(fd, 1 << 16)
        if not data:
            return b"".join(chunks), False
        if kept < cap:  # beyond the cap the stream is drained and dropped
            chunks.append(data[: cap - kept])
            kept += len(chunks[-1])
