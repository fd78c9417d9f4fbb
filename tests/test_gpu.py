"""The GPU paths, on a real CUDA device: ``course-dev gpu-check`` runs this file there and records each verdict.

Without CUDA every test but the MFU arithmetic skips with its reason (the CPU paths are tested in
test_train.py and test_device_policy.py); tests/test_gpu_check.py runs the whole check as a dry run.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from course_tools.cli import tuning
from course_utils import counting, gpt, runtime, train

ROOT = Path(__file__).resolve().parent.parent
DEVICE = runtime.device()
needs_cuda = pytest.mark.skipif(DEVICE.type != "cuda", reason=f"needs a CUDA device (this machine: {DEVICE.type})")
SMALL = gpt.GPTConfig(vocab_size=96, max_len=64, n_layers=2, n_heads=4, d_model=64)


def _data(n: int = 4096) -> torch.Tensor:
    return torch.randint(SMALL.vocab_size, (n,), generator=torch.Generator().manual_seed(0))


def _course(args: list[str], env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=full_env)


@needs_cuda
def test_set_up_on_cuda_turns_on_bf16_tf32_compile_and_fused_adamw():
    torch.backends.cuda.matmul.allow_tf32 = False
    run = train.set_up(gpt.GPT(SMALL), _data(), _data(), train.TrainConfig(batch_size=4))
    assert run.where.device.type == "cuda"
    assert run.dtype == torch.bfloat16  # every CUDA chip since Ampere does bf16
    assert torch.backends.cuda.matmul.allow_tf32
    assert run.model is not run.raw  # torch.compile wrapped it
    assert run.optimizer.defaults["fused"]


@needs_cuda
def test_bf16_autocast_computes_matmuls_in_bf16_and_the_loss_in_float32():
    model = gpt.GPT(SMALL).to(DEVICE)
    x = torch.randint(SMALL.vocab_size, (2, 16), device=DEVICE)
    with train.autocast(DEVICE, torch.bfloat16):
        logits, loss = model(x, x)
    assert logits.dtype == torch.bfloat16
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    ref, _ = model.float()(x)
    assert (logits.float() - ref).abs().max() < 0.05  # bf16 keeps 8 bits of mantissa


@needs_cuda
def test_compiled_model_equals_eager():
    model = gpt.GPT(SMALL).to(DEVICE).eval()
    x = torch.randint(SMALL.vocab_size, (2, 32), device=DEVICE)
    with torch.no_grad():
        eager, _ = model(x)
        compiled, _ = torch.compile(model)(x)
    assert (eager - compiled).abs().max() < 1e-4


@needs_cuda
@pytest.mark.parametrize("backend", ["FLASH_ATTENTION", "EFFICIENT_ATTENTION"])
def test_the_gpt_runs_on_the_fused_attention_kernels(backend):
    """Only the named kernel is allowed: if the model's attention did not reach PyTorch's
    scaled-dot-product attention with inputs the kernel accepts, PyTorch raises 'No available kernel'."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model = gpt.GPT(SMALL).to(DEVICE)
    x = torch.randint(SMALL.vocab_size, (2, 64), device=DEVICE)
    with sdpa_kernel(getattr(SDPBackend, backend)), train.autocast(DEVICE, torch.bfloat16):
        logits, loss = model(x, x)
        loss.backward()
    ref, _ = model.float()(x)
    assert (logits.float() - ref).abs().max() < 0.05
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


@needs_cuda
@pytest.mark.parametrize("position", ["learned", "sinusoidal", "rope", "alibi"])
def test_every_position_kind_runs_on_the_device(position):
    """The fixed sinusoids are made on the CPU; the model moves them to its device (gpt.GPT.forward)."""
    model = gpt.GPT(dataclasses.replace(SMALL, position=position)).to(DEVICE)
    idx = _data(2 * 16).view(2, 16).to(DEVICE)
    logits, loss = model(idx, idx)
    assert logits.device.type == "cuda" and torch.isfinite(loss)


@needs_cuda
def test_fused_adamw_step_on_cuda_equals_the_loop():
    torch.manual_seed(0)
    a, b = gpt.GPT(SMALL).to(DEVICE), gpt.GPT(SMALL).to(DEVICE)
    b.load_state_dict(a.state_dict())
    fused = train.make_optimizer(a, train.TrainConfig(), DEVICE)
    assert fused.defaults["fused"]
    loop = torch.optim.AdamW(b.parameters(), lr=fused.defaults["lr"], betas=fused.defaults["betas"], weight_decay=0.0)
    x = torch.randint(SMALL.vocab_size, (2, 16), device=DEVICE)
    for model, opt in ((a, fused), (b, loop)):
        for group in opt.param_groups:
            group["weight_decay"] = 0.0
        model(x, x)[1].backward()
        opt.step()
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert (p - q).abs().max() < 1e-5


@needs_cuda
def test_ddp_with_nccl_on_one_process_under_torchrun(tmp_path):
    code = ("import torch.distributed as dist\n"
            "from course_tools.cli import process_group\n"
            "where = process_group.join()\n"
            "assert dist.get_backend() == 'nccl', dist.get_backend()\n"
            "assert where.device.type == 'cuda' and where.world_size == 1\n"
            "dist.destroy_process_group()\n")
    script = tmp_path / "ddp.py"
    script.write_text(code)
    done = _course([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", str(script)])
    assert done.returncode == 0, done.stderr[-2000:]
    trained = _course([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
                       "-m", "course_tools.cli", "train", "--config", "smoke", "--max-iters", "20",
                       "--out", str(tmp_path / "run"), "--quiet"])
    assert trained.returncode == 0, trained.stderr[-2000:]
    assert train.load_checkpoint(tmp_path / "run" / "ckpt.pt")["step"] == 20


@needs_cuda
def test_resume_on_cuda_continues_exactly(tmp_path):
    """20 steps straight = 10 steps, a checkpoint, 10 more (deterministic kernels, eager, float32)."""
    code = f"""
import torch
from course_utils import gpt, train
torch.use_deterministic_algorithms(True)
cfg = gpt.GPTConfig(vocab_size=96, max_len=64, n_layers=2, n_heads=4, d_model=64)
data = torch.randint(96, (4096,), generator=torch.Generator().manual_seed(0))
tc = train.TrainConfig(batch_size=4, max_iters=20, warmup_iters=4, eval_interval=5, eval_iters=2,
                       compile=False, dtype="float32")
whole = train.train(gpt.GPT(cfg), data, data, tc, progress=False)
train.train(gpt.GPT(cfg), data, data, tc, out_dir={str(tmp_path)!r}, until=10, progress=False)
ckpt = train.load_checkpoint({str(tmp_path / 'ckpt.pt')!r})
resumed = train.train(gpt.GPT(cfg), data, data, tc, resume=ckpt, progress=False)
assert whole.history.loss == resumed.history.loss, (whole.history.loss, resumed.history.loss)
"""
    done = _course([sys.executable, "-c", code], env={"CUBLAS_WORKSPACE_CONFIG": ":4096:8"})
    assert done.returncode == 0, done.stderr[-2000:]


def test_mfu_arithmetic_uses_the_dense_bf16_peak():
    """The H200's and H100 SXM's dense bf16 peak is 989 TFLOP/s (data sheets headline twice that,
    with 2:4 sparsity); MFU = tokens/s × training FLOPs per token / peak."""
    assert tuning.peak_tflops("NVIDIA H200", torch.bfloat16) == 989.0
    assert tuning.peak_tflops("NVIDIA H100 80GB HBM3", torch.bfloat16) == 989.0
    assert tuning.peak_tflops("NVIDIA H100 PCIe", torch.bfloat16) == 756.0
    assert tuning.peak_tflops("NVIDIA A100-SXM4-80GB", torch.bfloat16) == 312.0
    assert tuning.peak_tflops("Tesla T4", torch.bfloat16) is None  # no bf16 units
    config = gpt.GPTConfig.preset("gpt2")
    n = counting.count_params(config)
    per_token = counting.flops_per_token(config, 1024, training=True)
    assert per_token == 6 * n + 12 * config.n_layers * 1024 * config.d_model
    tokens_per_s = 500_000
    mfu = tokens_per_s * per_token / (tuning.peak_tflops("NVIDIA H200", torch.bfloat16) * 1e12)
    assert round(mfu, 4) == round(tokens_per_s * (6 * 124_439_808 + 12 * 12 * 1024 * 768) / 989e12, 4)


@needs_cuda
def test_mfu_of_a_cuda_run_divides_by_the_devices_peak():
    result = train.train(gpt.GPT(SMALL), _data(), _data(),
                         train.TrainConfig(batch_size=4, max_iters=30, eval_interval=30, eval_iters=2,
                                           log_interval=5), progress=False)
    known = tuning.peak_tflops(torch.cuda.get_device_name(DEVICE), torch.bfloat16)
    mfu = tuning.mfu(result.tflops, DEVICE, torch.bfloat16)
    assert result.tflops > 0 and (mfu is not None) == (known is not None)
    if known:
        assert mfu == pytest.approx(result.tflops / known)
