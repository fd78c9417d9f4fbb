"""Block quantisation (양자화): weights stored as small integers, 32 at a time sharing a scale.

A float32 weight costs 32 bits. GGUF's block formats cut a row into blocks of 32 weights and store,
per block, one or two float16 numbers and 32 small integers:

- ``Q8_0``: a scale d and 32 signed bytes q; the weight is d·q. 2 + 32 = 34 bytes, 8.5 bits a weight.
- ``Q4_1``: a scale d, a minimum m and 32 four-bit numbers q in 0..15 (two per byte: the low nibbles
  hold weights 0..15 of the block, the high nibbles weights 16..31); the weight is d·q + m.
  2 + 2 + 16 = 20 bytes, 5 bits a weight.

``dequantize`` turns those bytes back into float32 exactly as llama.cpp's reference code does
(``gguf.quants.dequantize`` gives the same numbers, bit for bit); ``quantize`` writes them, so the
course can compress its own models the same way and measure what it costs.

Shapes: ``R`` rows, ``K`` weights per row (a multiple of 32), ``N`` blocks.
"""

from __future__ import annotations

import torch

BLOCK = 32  # weights per block, in both formats
BLOCK_BYTES = {"Q8_0": 2 + BLOCK, "Q4_1": 2 + 2 + BLOCK // 2}
FORMATS = tuple(BLOCK_BYTES)


def bits_per_weight(fmt: str) -> float:
    """Storage per weight, scale and minimum included: 8.5 for Q8_0, 5.0 for Q4_1."""
    _check_format(fmt)
    return 8 * BLOCK_BYTES[fmt] / BLOCK


def _check_format(fmt: str) -> None:
    if fmt not in BLOCK_BYTES:
        raise ValueError(f"quantisation type {fmt!r} is not supported; use one of {', '.join(FORMATS)}")


def _f16(raw: torch.Tensor) -> torch.Tensor:
    """(N, 2) little-endian bytes -> (N, 1) float32 (the float16 they spell, widened exactly)."""
    return raw.contiguous().view(torch.float16).float()


def dequantize(raw: torch.Tensor, fmt: str) -> torch.Tensor:
    """uint8 (R, N·bytes per block) -> float32 (R, N·32): the weights the blocks stand for."""
    _check_format(fmt)
    if raw.dtype != torch.uint8 or raw.dim() != 2 or raw.shape[1] % BLOCK_BYTES[fmt]:
        raise ValueError(f"{fmt} data must be uint8 (rows, a multiple of {BLOCK_BYTES[fmt]} bytes), "
                         f"got {raw.dtype} {tuple(raw.shape)}")
    rows = raw.shape[0]
    blocks = raw.reshape(-1, BLOCK_BYTES[fmt])  # (N, bytes)
    if fmt == "Q8_0":
        d = _f16(blocks[:, :2])
        q = blocks[:, 2:].contiguous().view(torch.int8).float()  # (N, 32) in -128..127
        return (q * d).reshape(rows, -1)
    d, m = _f16(blocks[:, :2]), _f16(blocks[:, 2:4])
    packed = blocks[:, 4:]  # (N, 16): byte j holds weight j (low nibble) and weight j + 16 (high)
    q = torch.cat([packed & 0x0F, packed >> 4], dim=1).float()  # (N, 32) in 0..15
    return (d * q + m).reshape(rows, -1)


def quantize(weight: torch.Tensor, fmt: str) -> torch.Tensor:
    """float (R, K) -> uint8 (R, K/32·bytes per block), the blocks ``dequantize`` reads back.

    Q8_0 picks d = max|w|/127, so the largest weight of each block is ±127·d; Q4_1 spreads 16
    levels from the block's minimum to its maximum, d = (max − min)/15. The scale and minimum are
    rounded to float16 first and the integers are chosen for the rounded values, so each weight
    comes back within d/2 of where it was (the rounding of d itself aside).
    """
    _check_format(fmt)
    if weight.dim() != 2 or weight.shape[1] % BLOCK:
        raise ValueError(f"quantize takes a (rows, K) matrix with K a multiple of {BLOCK}, got shape "
                         f"{tuple(weight.shape)}; pad the rows or keep this tensor in float")
    rows = weight.shape[0]
    x = weight.detach().float().reshape(-1, BLOCK)  # (N, 32)
    if fmt == "Q8_0":
        d = (x.abs().amax(dim=1, keepdim=True) / 127).half()
        inv = torch.where(d == 0, 0.0, 1.0 / d.float())
        q = torch.round(x * inv).clamp(-127, 127).to(torch.int8)
        out = torch.cat([d.view(torch.uint8), q.view(torch.uint8)], dim=1)
    else:
        m = x.amin(dim=1, keepdim=True).half()
        d = ((x.amax(dim=1, keepdim=True) - m.float()) / 15).half()
        inv = torch.where(d == 0, 0.0, 1.0 / d.float())
        q = torch.round((x - m.float()) * inv).clamp(0, 15).to(torch.uint8)
        packed = q[:, :BLOCK // 2] | (q[:, BLOCK // 2:] << 4)
        out = torch.cat([d.view(torch.uint8), m.view(torch.uint8), packed], dim=1)
    return out.reshape(rows, -1)


def roundtrip(weight: torch.Tensor, fmt: str) -> torch.Tensor:
    """``weight`` as it comes back after ``quantize`` then ``dequantize``: same shape, float32."""
    return dequantize(quantize(weight, fmt), fmt)
