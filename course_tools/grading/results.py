"""The contract for what a learner's kernel sends back, and the limited process that checks it.

An outputs file must be an uncompressed ``torch.save`` file, no bigger unpacked than packed,
holding tensors of plain dtypes, numbers and short strings in small lists, tuples and dicts, in
a fixed layout. It is checked *as it is*, never unfolded: every list, tuple, dict, tensor and
tensor storage may appear once only (a pickle can make a 2 KB file of lists that point at each
other describe a tree of billions of nodes), the nodes and tensor elements of a file are counted
against caps, and each tensor must own its storage exactly (``numel × itemsize`` bytes, no
overlapping or stride-0 views), so a tensor costs what the file paid for it and is never made
dense here. Anything else is refused with a one-line status.

``check_outputs`` does all of this in a child process forked from a small server (started once
per grading run, torch loaded once), under its own memory and CPU-time limits and a wall-clock
deadline, so that a file built to cost
time or memory costs that child, never the grader. What comes back is re-encoded by our own code
from checked values only.
"""

from __future__ import annotations

import io
import os
import pickle
import resource
import select
import signal
import struct
import subprocess
import sys
import threading
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from course_tools.grading.channel import FILE_CAP, MAX_FILES

RESULT_DTYPES = {torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.uint8, torch.int8,
                 torch.int16, torch.int32, torch.int64, torch.bool}


@dataclass(frozen=True)
class ResultCaps:
    """What one outputs file may hold, and what checking one submission's files may cost."""

    file_bytes: int = FILE_CAP
    nodes: int = 20_000  # lists, tuples, dicts, tensors, numbers and strings per file
    elements: int = 2**22  # tensor elements per file, all tensors together
    items: int = 64  # entries per list, tuple or dict
    depth: int = 6
    check_memory_mb: int = 1024  # address space the checking child may add to what it starts with
    check_cpu_seconds: int = 20
    check_wall_seconds: int = 120  # generous: the machine may be busy; CPU time is what the file can cost


DEFAULT_CAPS = ResultCaps()
# Per-lesson caps, for a lesson whose answers are larger than the default allows (e.g. a state dict).
LESSON_CAPS: dict[str, ResultCaps] = {}


def caps_for(lesson: str | None) -> ResultCaps:
    """The caps for a lesson's outputs (by notebook stem, e.g. ``"11_capstone"``, or its two-digit number)."""
    if lesson is None:
        return DEFAULT_CAPS
    return LESSON_CAPS.get(lesson) or LESSON_CAPS.get(lesson[:2]) or DEFAULT_CAPS


class ContractError(ValueError):
    """Results that break the contract; the message is the status line."""


def _check_zip(data: bytes) -> None:
    """torch.save writes an uncompressed zip; anything else (compressed members, members bigger
    than the file, too many of them) is refused before torch.load unpacks a byte."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
        raise ContractError("unreadable outputs file") from exc
    if len(members) > 4 * MAX_FILES * 64:
        raise ContractError("outputs file with too many parts")
    if any(m.compress_type != zipfile.ZIP_STORED or m.file_size != m.compress_size for m in members):
        raise ContractError("compressed outputs file (refused)")
    if sum(m.file_size for m in members) > len(data):
        raise ContractError("outputs file larger unpacked than packed (refused)")


def owns_storage_exactly(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` covers its whole storage once: offset 0, ``numel × itemsize`` bytes, and
    strides that are a permutation of a contiguous layout (no stride-0 or overlapping views).
    Reads sizes and strides only."""
    if tensor.numel() == 0:
        return tensor.untyped_storage().nbytes() == 0 and tensor.storage_offset() == 0
    if tensor.storage_offset() != 0 or tensor.untyped_storage().nbytes() != tensor.numel() * tensor.element_size():
        return False
    expected = 1
    for stride, size in sorted((st, s) for s, st in zip(tensor.shape, tensor.stride(), strict=True) if s != 1):
        if stride != expected:
            return False
        expected *= size
    return True


@dataclass
class _Walk:
    caps: ResultCaps
    seen: set[int] = field(default_factory=set)
    storages: set[int] = field(default_factory=set)
    nodes: int = 0
    elements: int = 0

    def once(self, value: Any) -> None:
        if id(value) in self.seen:
            raise ContractError("result reuses one object in several places (refused)")
        self.seen.add(id(value))

    def check(self, value: Any, depth: int = 0) -> None:
        """Raise ContractError unless ``value`` keeps the contract; visits each node once, copies nothing."""
        self.nodes += 1
        if self.nodes > self.caps.nodes:
            raise ContractError(f"result with too many parts (more than {self.caps.nodes})")
        if depth > self.caps.depth:
            raise ContractError("result nested too deeply")
        kind = type(value)
        if kind is torch.Tensor:
            self.tensor(value)
        elif kind in (int, float, bool) or value is None:
            if kind is int and abs(value) > 2**63:
                raise ContractError("result number too large")
        elif kind is str:
            if len(value) > 1000:
                raise ContractError("result string too long")
        elif kind in (list, tuple, dict):
            self.container(value, depth)
        else:
            raise ContractError(f"result of an unsupported type ({kind.__name__})")

    def container(self, value: list | tuple | dict, depth: int) -> None:
        if len(value) > self.caps.items:
            raise ContractError("result with too many items")
        if value:
            self.once(value)
        if type(value) is dict:
            if not all(type(k) is str and len(k) <= 100 for k in value):
                raise ContractError("result dict with keys other than short strings")
            value = value.values()
        for item in value:
            self.check(item, depth + 1)

    def tensor(self, value: torch.Tensor) -> None:
        if value.dtype not in RESULT_DTYPES or value.dim() > 8 or value.is_sparse or value.requires_grad:
            raise ContractError(f"result tensor of an unsupported type ({value.dtype})")
        self.once(value)
        self.elements += value.numel()
        if self.elements > self.caps.elements:
            raise ContractError(f"results with too many tensor elements (more than {self.caps.elements})")
        if not owns_storage_exactly(value):
            raise ContractError("result tensor that is a view (expanded, strided or sharing storage): refused")
        storage = value.untyped_storage()
        if storage.nbytes():
            if storage.data_ptr() in self.storages:
                raise ContractError("result tensors sharing storage (refused)")
            self.storages.add(storage.data_ptr())


def load_results(data: bytes, caps: ResultCaps = DEFAULT_CAPS) -> dict:
    """An outputs file checked and loaded: {"kind": "cases", "results": [...]}, {"kind": "missing",
    "function": str} or {"kind": "timeout"}. Raises ContractError for anything else. (In this
    process: call it through ``check_outputs`` for files from a sandbox.)"""
    if len(data) > caps.file_bytes:
        raise ContractError("outputs file too large")
    _check_zip(data)
    try:
        loaded = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as exc:  # weights_only refuses anything but tensors and plain values
        raise ContractError(f"the answer returned something other than tensors or numbers ({type(exc).__name__})") \
            from None
    _Walk(caps).check(loaded)
    kind = loaded.get("kind") if type(loaded) is dict else None
    if type(kind) is not str or kind not in ("cases", "missing", "timeout"):
        raise ContractError("malformed results")
    if kind == "cases" and type(loaded.get("results")) is not list:
        raise ContractError("malformed results")
    if kind == "missing" and type(loaded.get("function")) is not str:
        raise ContractError("malformed results")
    return loaded


# --- the checking child ------------------------------------------------------------------------------
# A server process (``python -m course_tools.grading.results``, started once, torch loaded once)
# forks one child per request; the child limits itself, checks, and writes its verdicts back. The
# server is single-threaded, so forking it is safe, which forking the grader (threads) is not.

_FRAME = struct.Struct(">Q")


def _read_exactly(stream, size: int) -> bytes | None:
    data = bytearray()
    while len(data) < size:
        chunk = stream.read(size - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def _address_space() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0


def _clean_messages(loaded: dict, hide: list[tuple[str, str]]) -> None:
    """Replace host paths in the learner's error messages (the case records' "message")."""
    for record in loaded.get("results", []) if loaded.get("kind") == "cases" else []:
        if type(record) is dict and type(record.get("message")) is str:
            for host, neutral in hide:
                record["message"] = record["message"].replace(host, neutral)


def _check_here(files: dict[str, bytes], caps: ResultCaps, hide: list[tuple[str, str]]) -> bytes:
    """In the child: limit itself, check every file, return {name: results | error text}, re-saved."""
    limit = _address_space() + caps.check_memory_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CPU, (caps.check_cpu_seconds, caps.check_cpu_seconds + 1))
    verdicts: dict[str, Any] = {}
    for name, data in files.items():
        try:
            verdicts[name] = load_results(data, caps)
            _clean_messages(verdicts[name], hide)
        except ContractError as exc:
            verdicts[name] = str(exc)
        except (MemoryError, RecursionError):
            verdicts[name] = "results too costly to check (refused)"
    buffer = io.BytesIO()
    torch.save(verdicts, buffer)
    return buffer.getvalue()


def _serve_one(request: bytes) -> bytes:
    """Fork a child for one request and return what it wrote (b"" if it failed or ran out of time)."""
    files, caps, hide = pickle.loads(request)  # from the grader, which started this server
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        try:
            reply = _check_here(files, caps, hide)
            with os.fdopen(write_fd, "wb") as pipe:
                pipe.write(reply)
        finally:
            os._exit(0)
    os.close(write_fd)
    chunks, kept, complete = [], 0, False
    deadline = time.monotonic() + caps.check_wall_seconds
    limit = 2 * sum(map(len, files.values())) + 2**20
    while (left := deadline - time.monotonic()) > 0:
        if not select.select([read_fd], [], [], left)[0]:
            continue
        chunk = os.read(read_fd, 1 << 16)
        if not chunk:
            complete = True
            break
        kept += len(chunk)
        if kept > limit:
            break
        chunks.append(chunk)
    os.close(read_fd)
    try:  # done writing (or out of time): it has nothing more to do
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
    os.waitpid(pid, 0)
    return b"".join(chunks) if complete else b""  # a reply cut short fails to load in the grader


def serve() -> None:
    """The server loop: frames in on stdin, frames out on stdout, until stdin closes."""
    torch.set_num_threads(1)
    source, sink = sys.stdin.buffer, sys.stdout.buffer
    while (head := _read_exactly(source, _FRAME.size)) is not None:
        request = _read_exactly(source, _FRAME.unpack(head)[0])
        if request is None:
            return
        reply = _serve_one(request)
        sink.write(_FRAME.pack(len(reply)) + reply)
        sink.flush()


class _Server:
    """The grader's handle on the checking server: started on first use, restarted if it dies or hangs."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.proc: subprocess.Popen | None = None

    def start(self) -> subprocess.Popen:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen([sys.executable, "-m", "course_tools.grading.results"],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        return self.proc

    def ask(self, request: bytes, wait: float) -> bytes:
        with self.lock:
            proc = self.start()
            try:
                proc.stdin.write(_FRAME.pack(len(request)) + request)
                proc.stdin.flush()
                if select.select([proc.stdout], [], [], wait)[0]:
                    head = _read_exactly(proc.stdout, _FRAME.size)
                    if head is not None:
                        return _read_exactly(proc.stdout, _FRAME.unpack(head)[0]) or b""
            except OSError:
                pass
            proc.kill()  # hung or gone: the next request starts a fresh one
            proc.wait()
            self.proc = None
            return b""


_SERVER = _Server()


def warm_up() -> None:
    """Start the checking server now (it loads torch), so the first submission does not wait for it."""
    with _SERVER.lock:
        _SERVER.start()


def check_outputs(files: dict[str, bytes], caps: ResultCaps = DEFAULT_CAPS,
                  hide: list[tuple[str, str]] = ()) -> dict[str, dict | ContractError]:
    """Each outputs file (by name) checked in a limited child process: its loaded results, or the
    ContractError that refuses it. A child that runs out of time or memory refuses every file.
    ``hide``: (host path, neutral name) pairs replaced in the learner's error messages."""
    if not files:
        return {}
    raw = _SERVER.ask(pickle.dumps((files, caps, list(hide))), caps.check_wall_seconds + 60)
    failure = ContractError("results too costly to check (refused)")
    if not raw:
        return {name: failure for name in files}
    try:
        verdicts = torch.load(io.BytesIO(raw), weights_only=True)  # our child's re-encoding, walked once more
    except Exception:  # a child that died mid-write
        verdicts = None
    checked: dict[str, dict | ContractError] = {}
    for name in files:
        verdict = verdicts.get(name) if type(verdicts) is dict else None
        try:
            if type(verdict) is not dict:
                raise ContractError(verdict[:300] if type(verdict) is str else str(failure))
            _Walk(caps).check(verdict)
            checked[name] = verdict
        except ContractError as exc:
            checked[name] = exc
    return checked


if __name__ == "__main__":
    serve()
