"""The results format: how values travel between the grader and a learner's kernel, and how the
grader reads what comes back without trusting it.

One file per exercise, ``NAME.safetensors``: a safetensors file whose tensors are named ``t0``,
``t1``, ... and whose metadata holds one entry, ``"value"``, a JSON document for the rest::

    null, true, false, an integer, a number, a string    themselves
    [v, ...]                                             a list
    {"tuple": [v, ...]}                                  a tuple
    {"dict": {"key": v, ...}}                            a dict (string keys)
    {"tensor": "t3"}                                     the file's tensor t3
    {"float": "nan"} ("inf", "-inf")                     a number JSON cannot spell

Every JSON object has exactly one key, its kind, so no value can pass for another, and every
tensor of the file is named exactly once. The grader writes its cases this way (``encode``), the
kernel its answers (``course_tools.grading.kernel_side``).

``decode`` reads a file from a sandbox as untrusted data and refuses anything else with a one-line
status (``ContractError``): before safetensors reads a byte of tensor data it checks the file's
size, the header's size and layout (tensor names, dtypes from ``DTYPES``, at most ``dims`` axes,
data offsets that tile the data exactly) and the tensors' count and elements, so a tensor costs
what the file paid for it; the document's length is checked before it is parsed, its depth,
items, strings and numbers while it becomes values. Nothing is unpickled.
"""

from __future__ import annotations

import json
import math
import struct
import sys
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import safetensors.torch
import torch

from course_tools.grading.channel import FILE_CAP

SUFFIX = ".safetensors"
DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64,
          "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64,
          "BOOL": torch.bool}
_NON_FINITE = ("nan", "inf", "-inf")
_LENGTH = struct.Struct("<Q")  # the header's length, in front of it


def file_name(exercise: str) -> str:
    """The file that carries an exercise's cases (``inputs/``) or answers (``out/``)."""
    return exercise + SUFFIX


@dataclass(frozen=True)
class ResultCaps:
    """What one outputs file may hold."""

    file_bytes: int = FILE_CAP
    header_bytes: int = 2**20  # the safetensors header, JSON document included
    tensors: int = 1024
    elements: int = 2**22  # tensor elements per file, all tensors together
    dims: int = 8  # axes per tensor
    nodes: int = 20_000  # lists, tuples, dicts, tensors, numbers and strings per file
    items: int = 64  # entries per list, tuple or dict
    depth: int = 6
    chars: int = 1000  # per string


DEFAULT_CAPS = ResultCaps()
UNCAPPED = ResultCaps(**{f.name: sys.maxsize for f in fields(ResultCaps)})  # the grader's own inputs file
# Per-lesson caps, for a lesson whose answers are larger than the default allows (e.g. a state dict).
LESSON_CAPS: dict[str, ResultCaps] = {}


def caps_for(lesson: str | None) -> ResultCaps:
    """The caps for a lesson's outputs (by notebook stem, e.g. ``"11_capstone"``, or its two-digit number)."""
    if lesson is None:
        return DEFAULT_CAPS
    return LESSON_CAPS.get(lesson) or LESSON_CAPS.get(lesson[:2]) or DEFAULT_CAPS


class ContractError(ValueError):
    """Results that break the contract; the message is the status line."""


# --- writing ---------------------------------------------------------------------------------------

def plain(value: Any) -> Any:
    """``value`` as the format carries it: tensors (as contiguous CPU copies of a dtype in
    ``DTYPES``), numbers, strings, None, and lists, tuples and dicts with string keys of them.
    NumPy arrays become tensors, NumPy scalars and subclasses (``torch.Size``, an enum) their plain
    values. Raises TypeError naming anything else."""
    if isinstance(value, np.ndarray):
        value = torch.from_numpy(value.copy())
    elif isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, torch.Tensor):
        if value.dtype not in DTYPES.values() or value.layout != torch.strided:
            layout = "" if value.layout == torch.strided else f" {value.layout}"
            kind = str(value.dtype).removeprefix("torch.") + layout
            raise TypeError(f"a tensor of {kind} cannot be graded: return a dense tensor of one of "
                            + ", ".join(str(d).removeprefix("torch.") for d in DTYPES.values()))
        return torch.empty(value.shape, dtype=value.dtype).copy_(value.detach())
    if value is None or isinstance(value, bool):
        return value
    for kind in (int, float, str):
        if isinstance(value, kind):
            return kind(value)
    if isinstance(value, (tuple, list)):
        return (tuple if isinstance(value, tuple) else list)(plain(v) for v in value)
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {str(k): plain(v) for k, v in value.items()}
    raise TypeError(f"a {type(value).__name__} cannot be graded: return tensors, numbers, strings, "
                    "or tuples, lists and dicts (string keys) of them")


def encode(value: Any) -> bytes:
    """The bytes of one file holding ``value`` (anything ``plain`` accepts)."""
    tensors: dict[str, torch.Tensor] = {}

    def document(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            tensors[f"t{len(tensors)}"] = v
            return {"tensor": f"t{len(tensors) - 1}"}
        if type(v) is float and not math.isfinite(v):
            return {"float": repr(v)}
        if type(v) is tuple:
            return {"tuple": [document(x) for x in v]}
        if type(v) is list:
            return [document(x) for x in v]
        if type(v) is dict:
            return {"dict": {k: document(x) for k, x in v.items()}}
        return v

    text = json.dumps(document(plain(value)), allow_nan=False, separators=(",", ":"))
    return safetensors.torch.save(tensors, metadata={"value": text})


# --- reading -------------------------------------------------------------------------------------

def _unique(pairs: list[tuple[str, Any]]) -> dict:
    """A JSON object, refused if a key repeats (a reader that keeps the first and one that keeps
    the last would see different files)."""
    found = dict(pairs)
    if len(found) != len(pairs):
        raise ContractError("outputs file with a repeated key (refused)")
    return found


def _refuse_constant(name: str) -> None:
    raise ContractError(f"outputs file with {name} outside a {{\"float\": ...}} (refused)")


def _json(text: bytes | str, refusal: str) -> Any:
    """``text`` parsed as strict JSON, or ContractError(``refusal``) (not UTF-8, too deep, a huge integer...)."""
    try:
        text = text.decode("utf-8") if isinstance(text, bytes) else text
        return json.loads(text, object_pairs_hook=_unique, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:  # ContractError is a ValueError: keep its message
        raise exc if isinstance(exc, ContractError) else ContractError(refusal) from None


def _header(data: bytes, caps: ResultCaps) -> tuple[dict, int]:
    """The file's header as JSON, and where its tensor data starts; its length is checked first."""
    if len(data) > caps.file_bytes:
        raise ContractError("outputs file too large")
    if len(data) < _LENGTH.size:
        raise ContractError("not a safetensors file (refused)")
    (length,) = _LENGTH.unpack_from(data)
    if length > len(data) - _LENGTH.size:
        raise ContractError("not a safetensors file (refused)")
    if length > caps.header_bytes:
        raise ContractError(f"outputs file with a header over {caps.header_bytes} bytes (refused)")
    header = _json(data[_LENGTH.size:_LENGTH.size + length], "not a safetensors file (refused)")
    if type(header) is not dict:
        raise ContractError("not a safetensors file (refused)")
    return header, _LENGTH.size + length


def _is_count(x: Any) -> bool:
    return type(x) is int and x >= 0


def _tensor_layout(header: dict, data_bytes: int, caps: ResultCaps) -> dict[str, tuple[torch.dtype, list[int]]]:
    """Each tensor's (dtype, shape), once the header is found to name ``t0``..``tN-1`` with allowed
    dtypes and shapes, and byte ranges that tile the ``data_bytes`` after it exactly."""
    if len(header) > caps.tensors:
        raise ContractError(f"outputs file with too many tensors (more than {caps.tensors})")
    if set(header) != {f"t{i}" for i in range(len(header))}:
        raise ContractError("outputs file with tensors not named t0, t1, ... (refused)")
    layout, spans, elements = {}, [], 0
    for name, info in header.items():
        if type(info) is not dict or set(info) != {"dtype", "shape", "data_offsets"}:
            raise ContractError("malformed safetensors header (refused)")
        dtype = DTYPES.get(info["dtype"]) if type(info["dtype"]) is str else None
        if dtype is None:
            raise ContractError(f"result tensor of an unsupported type ({str(info['dtype'])[:20]})")
        shape, offsets = info["shape"], info["data_offsets"]
        if type(shape) is not list or len(shape) > caps.dims or not all(map(_is_count, shape)):
            raise ContractError("result tensor of an unsupported shape (refused)")
        elements += math.prod(shape)
        if elements > caps.elements:
            raise ContractError(f"results with too many tensor elements (more than {caps.elements})")
        if type(offsets) is not list or len(offsets) != 2 or not all(map(_is_count, offsets)) \
                or offsets[1] - offsets[0] != math.prod(shape) * dtype.itemsize:
            raise ContractError("tensor data that does not match its header (refused)")
        layout[name] = (dtype, shape)
        spans.append(offsets)
    end = 0
    for start, stop in sorted(spans):
        if start != end:
            raise ContractError("tensor data that does not match its header (refused)")
        end = stop
    if end != data_bytes:
        raise ContractError("tensor data that does not match its header (refused)")
    return layout


class _Reader:
    """Turns a parsed document into values, counting against the caps; each tensor is named once."""

    def __init__(self, caps: ResultCaps, tensors: dict[str, torch.Tensor]) -> None:
        self.caps, self.tensors, self.named, self.nodes = caps, tensors, set(), 0

    def value(self, doc: Any, depth: int = 0) -> Any:
        self.nodes += 1
        if self.nodes > self.caps.nodes:
            raise ContractError(f"result with too many parts (more than {self.caps.nodes})")
        if depth > self.caps.depth:
            raise ContractError("result nested too deeply")
        if type(doc) is list:
            return [self.value(v, depth + 1) for v in self.items(doc)]
        if type(doc) is dict:
            return self.tagged(doc, depth)
        if type(doc) is int and abs(doc) > 2**63:
            raise ContractError("result number too large")
        if type(doc) is str and len(doc) > self.caps.chars:
            raise ContractError("result string too long")
        return doc  # None, a bool, a number or a string: JSON has nothing else

    def tagged(self, doc: dict, depth: int) -> Any:
        """A JSON object: one key, the kind of value it spells."""
        if len(doc) == 1:
            [(tag, body)] = doc.items()
            if tag == "tuple" and type(body) is list:
                return tuple(self.value(v, depth + 1) for v in self.items(body))
            if tag == "dict" and type(body) is dict:
                if not all(len(k) <= 100 for k in self.items(body)):
                    raise ContractError("result dict with keys other than short strings")
                return {k: self.value(v, depth + 1) for k, v in body.items()}
            if tag == "tensor" and type(body) is str:
                return self.tensor(body)
            if tag == "float" and body in _NON_FINITE:
                return float(body)
        raise ContractError("result of an unknown kind (refused)")

    def items(self, container: list | dict) -> list | dict:
        if len(container) > self.caps.items:
            raise ContractError("result with too many items")
        return container

    def tensor(self, name: str) -> torch.Tensor:
        if name not in self.tensors:
            raise ContractError("result names a tensor the file does not hold (refused)")
        if name in self.named:
            raise ContractError("result names one tensor twice (refused)")
        self.named.add(name)
        return self.tensors[name]


def decode(data: bytes, caps: ResultCaps = DEFAULT_CAPS) -> Any:
    """The value in one file, checked against ``caps`` as described above; raises ContractError."""
    header, start = _header(data, caps)
    metadata = header.pop("__metadata__", None)
    if type(metadata) is not dict or set(metadata) != {"value"} or type(metadata["value"]) is not str:
        raise ContractError("outputs file without its results document (refused)")
    layout = _tensor_layout(header, len(data) - start, caps)
    document = _json(metadata["value"], "results document that is not JSON (refused)")
    tensors = safetensors.torch.load(data) if layout else {}
    if {name: (t.dtype, list(t.shape)) for name, t in tensors.items()} != layout:  # what the library read
        raise ContractError("tensor data that does not match its header (refused)")
    reader = _Reader(caps, tensors)
    value = reader.value(document)
    if reader.named != set(tensors):
        raise ContractError("outputs file with tensors the result does not name (refused)")
    return value


def load_results(data: bytes, caps: ResultCaps = DEFAULT_CAPS) -> dict:
    """An outputs file checked and read: {"kind": "cases", "results": [...]}, {"kind": "missing",
    "function": str} or {"kind": "timeout"}. Raises ContractError for anything else."""
    loaded = decode(data, caps)
    kind = loaded.get("kind") if type(loaded) is dict else None
    if type(kind) is not str or kind not in ("cases", "missing", "timeout"):
        raise ContractError("malformed results")
    if kind == "cases" and type(loaded.get("results")) is not list:
        raise ContractError("malformed results")
    if kind == "missing" and type(loaded.get("function")) is not str:
        raise ContractError("malformed results")
    return loaded


def _clean_messages(loaded: dict, hide: list[tuple[str, str]]) -> None:
    """Replace host paths in the learner's error messages (the case records' "message")."""
    for record in loaded.get("results", []) if loaded["kind"] == "cases" else []:
        if type(record) is dict and type(record.get("message")) is str:
            for host, neutral in hide:
                record["message"] = record["message"].replace(host, neutral)


def check_outputs(files: dict[str, bytes], caps: ResultCaps = DEFAULT_CAPS,
                  hide: list[tuple[str, str]] = ()) -> dict[str, dict | ContractError]:
    """Each outputs file (by name): its checked results, or the ContractError that refuses it.
    ``hide``: (host path, neutral name) pairs replaced in the learner's error messages."""
    checked: dict[str, dict | ContractError] = {}
    for name, data in files.items():
        try:
            checked[name] = load_results(data, caps)
            _clean_messages(checked[name], list(hide))
        except ContractError as exc:
            checked[name] = exc
    return checked
