"""GGUF, llama.cpp's one-file model format: read a LLaMA-architecture file into the course's GPT.

A GGUF file is a header (magic "GGUF", version, counts), a table of metadata (key -> value: the
architecture's sizes, the tokenizer's vocabulary and merges, the chat template), a tensor table
(name, shape, type, offset) and the tensor data, aligned so it can be memory-mapped. The
``gguf`` package (maintained by the llama.cpp project) parses the container; the numbers inside
the quantised blocks are turned into float32 by ``course_utils.quantize``.

Names: GGUF calls the token embedding ``token_embd``, a block ``blk.i`` with ``attn_q/k/v/output``,
``ffn_gate/up/down``, ``attn_norm`` and ``ffn_norm``, and the final norm ``output_norm``.

Layout of W_Q and W_K: llama.cpp's converter permutes Hugging Face's rows back into the order of
Meta's original code, where RoPE rotates neighbour features (2j, 2j+1), which is what
``positional.apply_rope`` does. So the file's rows load into the course's GPT as they are, while
Hugging Face's ``q_proj`` (rotate-half order) needs ``positional.rope_halves_to_pairs`` first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from course_utils import quantize
from course_utils.bpe import GPT2_PATTERN, PretrainedBPETokenizer
from course_utils.config import GPTConfig, llama

FLOAT_TYPES = ("F32", "F16")
SUPPORTED_TYPES = (*FLOAT_TYPES, *quantize.FORMATS)
CONTROL = 3  # tokenizer.ggml.token_type of a control token such as <|im_start|>

# the course's state-dict names -> GGUF's, per block and for the whole model
BLOCK_NAMES = {
    "attn.W_Q.weight": "attn_q.weight", "attn.W_K.weight": "attn_k.weight", "attn.W_V.weight": "attn_v.weight",
    "attn.W_O.weight": "attn_output.weight", "ffn.W_gate.weight": "ffn_gate.weight",
    "ffn.W_in.weight": "ffn_up.weight", "ffn.W_out.weight": "ffn_down.weight",
    "norm1.gamma": "attn_norm.weight", "norm2.gamma": "ffn_norm.weight",
}
MODEL_NAMES = {"token_embedding.weight": "token_embd.weight", "final_norm.gamma": "output_norm.weight"}


class GGUFError(ValueError):
    """The file cannot be loaded; the message is one line naming the fix."""


@dataclass
class Tensor:
    """One entry of the tensor table: ``shape`` in PyTorch order (rows, columns), ``raw`` its bytes."""

    name: str
    type: str
    shape: tuple[int, ...]
    raw: np.ndarray  # the stored data as numpy (memory-mapped), uint8 for quantised types

    @property
    def n_bytes(self) -> int:
        return int(self.raw.nbytes)

    def to_float(self) -> torch.Tensor:
        """The tensor as float32, dequantised with the course's own code."""
        if self.type not in SUPPORTED_TYPES:
            raise GGUFError(f"tensor {self.name} is stored as {self.type}, which the course cannot read; "
                            f"use a GGUF quantised with {', '.join(SUPPORTED_TYPES)}")
        data = torch.from_numpy(np.array(self.raw))  # a private copy: the memory map is read-only
        if self.type in FLOAT_TYPES:
            return data.float().reshape(self.shape)
        return quantize.dequantize(data.reshape(self.shape[0], -1), self.type).reshape(self.shape)


@dataclass
class GGUFFile:
    """What a GGUF file holds: its version, its metadata and its tensors by name."""

    path: Path
    version: int
    metadata: dict[str, Any]  # numbers, strings, and lists of them
    tensors: dict[str, Tensor] = field(repr=False)

    def tensor(self, name: str) -> Tensor:
        if name not in self.tensors:
            raise GGUFError(f"{self.path.name} has no tensor {name!r}; it is not a complete LLaMA model file")
        return self.tensors[name]


def _reader(path: Path):
    """``gguf.GGUFReader`` parsing through a plain-array view of its memory map: numpy's memmap
    subclass does bookkeeping on every slice, which makes the 98,000 strings of a vocabulary and
    its merges take several times longer to read."""
    from gguf import GGUFReader

    class Reader(GGUFReader):
        def _get(self, offset, dtype, count=1, override_order=None):
            if type(self.data) is np.memmap:
                self.data = self.data.view(np.ndarray)  # type: ignore[assignment]  # the same bytes, still mapped
            return super()._get(offset, dtype, count, override_order)

    return Reader(path)


def read(path: str | Path) -> GGUFFile:
    """Parse the header, metadata and tensor table of a GGUF file (the data stays memory-mapped)."""
    path = Path(path)
    if not path.is_file():
        raise GGUFError(f"no GGUF file at {path}; check the path (pretrained.fetch() fetches SmolLM2's)")
    try:
        reader = _reader(path)
    except (ValueError, OSError, IndexError, KeyError) as err:  # gguf says "not a GGUF file" or fails mid-table
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise GGUFError(f"{path.name} is not a readable GGUF file ({reason}); delete it and fetch it again") from None
    metadata: dict[str, Any] = {}
    for key, value in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        metadata[key] = value.contents()  # numbers, strings, and lists (vocabulary, merges, token types)
    tensors = {}
    for t in reader.tensors:
        shape = tuple(int(n) for n in reversed(t.shape.tolist()))  # GGUF lists the fastest axis first
        tensors[t.name] = Tensor(t.name, t.tensor_type.name, shape, t.data)
    version = int(reader.fields["GGUF.version"].contents())
    return GGUFFile(path, version, metadata, tensors)


def _get(file: GGUFFile, key: str) -> Any:
    if key not in file.metadata:
        raise GGUFError(f"{file.path.name} lacks the metadata key {key!r}; it is not a complete LLaMA model file")
    return file.metadata[key]


def gpt_config(file: GGUFFile) -> GPTConfig:
    """The course's ``GPTConfig`` for a LLaMA-architecture file: lesson 09's switches, sizes from the metadata."""
    arch = file.metadata.get("general.architecture")
    if arch != "llama":
        raise GGUFError(f"{file.path.name} holds a {arch!r} model; the course loads the 'llama' architecture "
                        "(SmolLM2, LLaMA, TinyLlama); pick a GGUF of one of those")
    d, n_heads = int(_get(file, "llama.embedding_length")), int(_get(file, "llama.attention.head_count"))
    rope_dim = int(file.metadata.get("llama.rope.dimension_count", d // n_heads))
    if rope_dim != d // n_heads:
        raise GGUFError(f"RoPE rotates {rope_dim} of {d // n_heads} features per head here; "
                        "the course rotates all of them, so this file is not supported")
    return llama(file.tensor("token_embd.weight").shape[0], int(_get(file, "llama.context_length")),
                 int(_get(file, "llama.block_count")), n_heads, d, int(_get(file, "llama.feed_forward_length")),
                 n_kv_heads=int(file.metadata.get("llama.attention.head_count_kv", n_heads)),
                 rope_base=float(file.metadata.get("llama.rope.freq_base", 10000.0)),
                 eps=float(_get(file, "llama.attention.layer_norm_rms_epsilon")),
                 tie_embeddings="output.weight" not in file.tensors)


def state_dict_names(config: GPTConfig) -> dict[str, str]:
    """The course's parameter name -> the GGUF tensor that fills it."""
    names = dict(MODEL_NAMES)
    if not config.tie_embeddings:
        names["lm_head.weight"] = "output.weight"
    for i in range(config.n_layers):
        names.update({f"blocks.{i}.{ours}": f"blk.{i}.{theirs}" for ours, theirs in BLOCK_NAMES.items()})
    return names


def llama_state_dict(file: GGUFFile, config: GPTConfig) -> dict[str, torch.Tensor]:
    """Every weight the course's GPT needs, dequantised to float32 and named the course's way.

    No permutation: the file's W_Q and W_K rows are already in neighbour-pair order (module docstring).
    """
    state = {}
    for ours, theirs in state_dict_names(config).items():
        state[ours] = file.tensor(theirs).to_float()
    return state


def tokenizer(file: GGUFFile) -> PretrainedBPETokenizer:
    """The course's byte-level BPE tokenizer holding the file's vocabulary, merges and control tokens."""
    kind = file.metadata.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise GGUFError(f"{file.path.name} has a {kind!r} tokenizer; the course reads byte-level BPE "
                        "vocabularies (tokenizer.ggml.model = 'gpt2')")
    tokens = list(_get(file, "tokenizer.ggml.tokens"))
    types = list(file.metadata.get("tokenizer.ggml.token_type", []))
    special = [t for t, kind in zip(tokens, types, strict=True) if kind == CONTROL]
    return PretrainedBPETokenizer(tokens, list(_get(file, "tokenizer.ggml.merges")), special, GPT2_PATTERN)


def memory_report(file: GGUFFile) -> dict[str, float]:
    """Bytes of the tensors as stored and as float32, and the bits each weight costs in the file."""
    stored = sum(t.n_bytes for t in file.tensors.values())
    weights = sum(int(np.prod(t.shape)) for t in file.tensors.values())
    return {"weights": weights, "stored_bytes": stored, "float32_bytes": 4 * weights,
            "bits_per_weight": 8 * stored / weights}
