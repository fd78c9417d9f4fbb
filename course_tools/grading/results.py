"""The contract for what a learner's kernel sends back: an uncompressed ``torch.save`` file, no
bigger than it looks, holding bounded tensors of plain dtypes, numbers and short strings in a
fixed layout. Anything else is refused with a one-line status before it can cost the grader
memory or time."""

from __future__ import annotations

import io
import zipfile
from typing import Any

import torch

from course_tools.grading.channel import FILE_CAP, MAX_FILES

MAX_NUMEL = 2**22  # elements per tensor in a result
MAX_ITEMS = 64  # entries per list/tuple/dict in a result
MAX_DEPTH = 6
RESULT_DTYPES = {torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.uint8, torch.int8,
                 torch.int16, torch.int32, torch.int64, torch.bool}


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
    if len(members) > 4 * MAX_FILES * MAX_ITEMS:
        raise ContractError("outputs file with too many parts")
    if any(m.compress_type != zipfile.ZIP_STORED or m.file_size != m.compress_size for m in members):
        raise ContractError("compressed outputs file (refused)")
    if sum(m.file_size for m in members) > len(data):
        raise ContractError("outputs file larger unpacked than packed (refused)")


def _check_value(value: Any, depth: int = 0) -> Any:
    """The value if it keeps the contract (bounded tensors of plain dtypes, numbers, short strings,
    small lists, tuples and dicts of them), returned with every tensor made dense; else raise."""
    if depth > MAX_DEPTH:
        raise ContractError("result nested too deeply")
    kind = type(value)
    if kind is torch.Tensor:
        if value.dtype not in RESULT_DTYPES or value.numel() > MAX_NUMEL or value.dim() > 8:
            raise ContractError(f"result tensor too large or of an unsupported type ({value.dtype})")
        return value.contiguous().clone()
    if kind in (int, float, bool) or value is None:
        if kind is int and abs(value) > 2**63:
            raise ContractError("result number too large")
        return value
    if kind is str:
        return value[:1000]
    if kind in (list, tuple, dict) and len(value) > MAX_ITEMS:
        raise ContractError("result with too many items")
    if kind in (list, tuple):
        return kind(_check_value(v, depth + 1) for v in value)
    if kind is dict and all(type(k) is str for k in value):
        return {k[:100]: _check_value(v, depth + 1) for k, v in value.items()}
    raise ContractError(f"result of an unsupported type ({kind.__name__})")


def load_results(data: bytes) -> dict:
    """An outputs file checked and loaded: {"kind": "cases", "results": [...]}, {"kind": "missing",
    "function": str} or {"kind": "timeout"}. Raises ContractError for anything else."""
    if len(data) > FILE_CAP:
        raise ContractError("outputs file too large")
    _check_zip(data)
    try:
        loaded = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as exc:  # weights_only refuses anything but tensors and plain values
        raise ContractError(f"the answer returned something other than tensors or numbers ({type(exc).__name__})") \
            from None
    results = _check_value(loaded)
    kind = results.get("kind") if type(results) is dict else None
    if type(kind) is not str or kind not in ("cases", "missing", "timeout"):
        raise ContractError("malformed results")
    if kind == "cases" and type(results.get("results")) is not list:
        raise ContractError("malformed results")
    if kind == "missing" and type(results.get("function")) is not str:
        raise ContractError("malformed results")
    return results
