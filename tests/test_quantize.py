"""Block quantisation: our Q8_0/Q4_1 bytes and numbers against the gguf package's reference code."""

import numpy as np
import pytest
import torch

from course_utils import quantize


@pytest.fixture
def weights():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(24, 128, generator=g) * 0.05
    w[0, :32] = 0.0  # a block of zeros: d = 0 must not divide by zero
    w[1, :32] = 0.3  # a constant block: max = min
    w[2, 5] = 4.0  # an outlier stretches its block's scale
    return w


@pytest.mark.parametrize("fmt", quantize.FORMATS)
def test_dequantize_equals_gguf_element_for_element(weights, fmt):
    gguf = pytest.importorskip("gguf")  # the reference: the gguf package (the lesson12 extra)
    qtype = getattr(gguf.GGMLQuantizationType, fmt)
    raw = gguf.quants.quantize(weights.numpy(), qtype)  # blocks written by the gguf package
    ours = quantize.dequantize(torch.from_numpy(raw), fmt)
    assert ours.dtype == torch.float32 and ours.shape == weights.shape
    assert np.array_equal(ours.numpy(), gguf.quants.dequantize(raw, qtype))


@pytest.mark.parametrize("fmt", quantize.FORMATS)
def test_our_blocks_read_back_by_gguf(weights, fmt):
    gguf = pytest.importorskip("gguf")  # the reference: the gguf package (the lesson12 extra)
    raw = quantize.quantize(weights, fmt)
    assert raw.dtype == torch.uint8 and raw.shape == (24, 128 // 32 * quantize.BLOCK_BYTES[fmt])
    reference = gguf.quants.dequantize(raw.numpy(), getattr(gguf.GGMLQuantizationType, fmt))
    assert np.array_equal(quantize.dequantize(raw, fmt).numpy(), reference)


@pytest.mark.parametrize("fmt", quantize.FORMATS)
def test_roundtrip_error_is_at_most_half_a_step(weights, fmt):
    back = quantize.roundtrip(weights, fmt)
    blocks, err = weights.reshape(-1, 32), (back - weights).abs().reshape(-1, 32)
    if fmt == "Q8_0":
        step = blocks.abs().amax(1, keepdim=True) / 127
    else:
        step = (blocks.amax(1, keepdim=True) - blocks.amin(1, keepdim=True)) / 15
    # half a step, plus the float16 rounding of the scale (and of the minimum) times the largest level
    slack = step * 2 ** -10 * (127 if fmt == "Q8_0" else 15) + blocks.abs().amax(1, keepdim=True) * 2 ** -10
    assert bool((err <= step / 2 + slack + 1e-12).all())
    assert torch.equal(back[0, :32], torch.zeros(32))
    assert bool(torch.allclose(back[1, :32], torch.full((32,), 0.3), atol=1e-3))
    assert float((back - weights).abs().max()) > 0  # it is lossy: the test would notice a copy


def test_q4_1_block_layout_by_hand():
    # one block: d = 0.5, m = -1, q = 0..15 then 15..0; the low nibble holds weight j, the high one j + 16
    q = torch.tensor(list(range(16)) + list(range(15, -1, -1)), dtype=torch.uint8)
    header = torch.tensor([0.5, -1.0], dtype=torch.float16).view(torch.uint8)
    raw = torch.cat([header, q[:16] | (q[16:] << 4)])[None]
    assert raw.shape == (1, 20)
    assert torch.equal(quantize.dequantize(raw, "Q4_1")[0], 0.5 * q.float() - 1.0)


def test_bits_per_weight():
    assert quantize.bits_per_weight("Q8_0") == 8.5 and quantize.bits_per_weight("Q4_1") == 5.0


def test_bad_input_names_the_fix():
    with pytest.raises(ValueError, match="Q4_1, or|use one of Q8_0, Q4_1"):
        quantize.quantize(torch.zeros(2, 32), "Q4_K")
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize.quantize(torch.zeros(2, 33), "Q8_0")
    with pytest.raises(ValueError, match="uint8"):
        quantize.dequantize(torch.zeros(2, 20), "Q4_1")
