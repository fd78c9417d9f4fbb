"""LoRA: equal to peft's LoRA on the same weights, zero at the start, merge/unmerge, adapters on disk."""

import copy
import dataclasses

import pytest
import torch
from torch import nn

from course_utils import gpt, lora

TARGETS = ("attn.W_Q", "attn.W_V", "ffn.W_in")


def with_random_B(model: nn.Module, seed: int = 1) -> None:
    """B is zero at init; a parity test with B = 0 would not see a wrong B or a wrong α/r."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in lora.lora_layers(model).values():
            layer.B.copy_(torch.randn(layer.B.shape, generator=g) * 0.1)


def peft_twin(ours: nn.Module, plain: nn.Module, rank: int, alpha: float) -> nn.Module:
    """peft's LoRA injected into a copy of the un-adapted model, holding our A and B (the model is GPT-2-style:
    its attention calls W_Q, W_K, W_V as layers, so peft's layers, whose ``weight`` is the frozen base weight,
    take part as ours do). Skips the calling test where peft (the lesson13 extra) is not installed."""
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=rank, lora_alpha=alpha, target_modules=[t.split(".")[-1] for t in TARGETS],
                             lora_dropout=0.0)
    theirs = peft.inject_adapter_in_model(config, copy.deepcopy(plain))
    mods = dict(theirs.named_modules())
    with torch.no_grad():
        for name, layer in lora.lora_layers(ours).items():
            mods[name].lora_A["default"].weight.copy_(layer.A)
            mods[name].lora_B["default"].weight.copy_(layer.B)
    return theirs


@pytest.mark.parametrize("rank, alpha", [(1, 1.0), (4, 8.0), (8, 4.0)])
def test_equals_peft_outputs_and_gradients(rank, alpha, tiny_gpt):
    plain = tiny_gpt()
    ours = copy.deepcopy(plain)
    names = lora.add_lora(ours, TARGETS, rank, alpha)
    with_random_B(ours)
    theirs = peft_twin(ours, plain, rank, alpha)
    idx = torch.randint(40, (3, 16), generator=torch.Generator().manual_seed(2))
    logits_ours, loss_ours = ours(idx[:, :-1], idx[:, 1:])
    logits_theirs, loss_theirs = theirs(idx[:, :-1], idx[:, 1:])
    assert (logits_ours - logits_theirs).abs().max().item() < 1e-5
    loss_ours.backward()
    loss_theirs.backward()
    mods = dict(theirs.named_modules())
    for name in names:
        layer = ours.get_submodule(name)
        assert layer.A.grad.abs().max() > 0 and layer.B.grad.abs().max() > 0
        torch.testing.assert_close(layer.A.grad, mods[name].lora_A["default"].weight.grad, atol=1e-6, rtol=1e-4)
        torch.testing.assert_close(layer.B.grad, mods[name].lora_B["default"].weight.grad, atol=1e-6, rtol=1e-4)
    assert lora.trainable_parameters(ours) == sum(p.numel() for p in theirs.parameters() if p.requires_grad)


@pytest.mark.parametrize("config", [{}, dict(norm="rmsnorm", position="rope", activation="swiglu", bias=False,
                                              n_kv_heads=2)])
def test_both_attention_paths_see_the_adapters(config, tiny_gpt):
    """PyTorch's scaled-dot-product kernel and the explicit softmax give the same logits and the same
    adapter gradients on an adapted model: both call W_Q, W_K, W_V as layers, so both see W + ΔW."""
    kernel = tiny_gpt(**config)
    lora.add_lora(kernel, ("W_Q", "W_K", "W_V", "W_gate"), 2, 4.0)
    with_random_B(kernel)
    explicit = gpt.GPT(dataclasses.replace(kernel.config, sdpa=False)).eval()
    lora.add_lora(explicit, ("W_Q", "W_K", "W_V", "W_gate"), 2, 4.0)
    explicit.load_state_dict(kernel.state_dict())
    idx = torch.randint(40, (2, 16))
    out_kernel, out_explicit = kernel(idx[:, :-1], idx[:, 1:]), explicit(idx[:, :-1], idx[:, 1:])
    torch.testing.assert_close(out_kernel[0], out_explicit[0], atol=1e-5, rtol=1e-5)
    out_kernel[1].backward()
    out_explicit[1].backward()
    for name, layer in lora.lora_layers(kernel).items():
        assert layer.B.grad.abs().max() > 0
        torch.testing.assert_close(layer.B.grad, explicit.get_submodule(name).B.grad, atol=1e-6, rtol=1e-4)


def test_one_layer_is_the_formula():
    torch.manual_seed(0)
    base = nn.Linear(6, 5)
    layer = lora.LoRALinear(base, rank=2, alpha=3.0)
    with torch.no_grad():
        layer.B.normal_()
    x = torch.randn(4, 7, 6)
    expected = base(x) + (3.0 / 2) * x @ layer.A.T @ layer.B.T
    torch.testing.assert_close(layer(x), expected)
    assert layer.A.shape == (2, 6) and layer.B.shape == (5, 2)
    assert [n for n, p in layer.named_parameters() if p.requires_grad] == ["A", "B"]


def test_zero_at_init_leaves_the_model_unchanged(tiny_gpt):
    plain = tiny_gpt()
    ours = copy.deepcopy(plain)
    lora.add_lora(ours, TARGETS, 4, 8.0)
    idx = torch.randint(40, (2, 16))
    assert torch.equal(ours(idx)[0], plain(idx)[0])
    assert all(torch.count_nonzero(m.B) == 0 and torch.count_nonzero(m.A) > 0
               for m in lora.lora_layers(ours).values())


def test_only_adapters_train_and_count_is_r_times_in_plus_out(tiny_gpt):
    model = tiny_gpt()
    names = lora.add_lora(model, TARGETS, 4, 8.0)
    assert len(names) == 2 * len(TARGETS)
    shapes = [tuple(model.get_submodule(n).base.weight.shape) for n in names]
    # per block: W_Q 32→32, W_V 32→32, W_in 32→128: 4·(64 + 64 + 160) = 1,152
    assert lora.trainable_parameters(model) == lora.lora_parameter_count(shapes, 4) == 2 * 1152
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained == {f"{n}.{p}" for n in names for p in ("A", "B")}


def test_merge_then_unmerge_round_trip(tiny_gpt):
    model = tiny_gpt()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    lora.add_lora(model, TARGETS, 4, 8.0)
    with_random_B(model)
    idx = torch.randint(40, (2, 16))
    adapted = model(idx)[0]
    layer = model.get_submodule("blocks.0.attn.W_Q")
    merged = layer.merge()
    assert isinstance(merged, nn.Linear) and layer.merged
    for m in lora.lora_layers(model).values():
        m.merge()
    torch.testing.assert_close(model(idx)[0], adapted, atol=1e-5, rtol=1e-5)
    for m in lora.lora_layers(model).values():
        m.unmerge()
    torch.testing.assert_close(model(idx)[0], adapted, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(layer.base.weight, before["blocks.0.attn.W_Q.weight"], atol=1e-6, rtol=0)


def test_merge_lora_gives_back_the_plain_architecture(tiny_gpt):
    plain = tiny_gpt()
    model = copy.deepcopy(plain)
    lora.add_lora(model, TARGETS, 2, 2.0)
    with_random_B(model)
    idx = torch.randint(40, (2, 16))
    adapted = model(idx)[0]
    lora.merge_lora(model)
    assert not lora.lora_layers(model)
    assert set(model.state_dict()) == set(plain.state_dict())
    torch.testing.assert_close(model(idx)[0], adapted, atol=1e-5, rtol=1e-5)
    assert not torch.equal(model(idx)[0], plain(idx)[0])


def test_save_and_load_adapter(tmp_path, tiny_gpt):
    trained = tiny_gpt()
    lora.add_lora(trained, TARGETS, 4, 8.0)
    with_random_B(trained)
    path = lora.save_adapter(trained, tmp_path / "adapter.pt")
    fresh = tiny_gpt()
    names = lora.load_adapter(fresh, path)
    assert names == list(lora.lora_layers(trained))
    idx = torch.randint(40, (2, 16))
    assert torch.equal(fresh(idx)[0], trained(idx)[0])
    state = torch.load(path, weights_only=True)
    assert sum(t.numel() for t in state["tensors"].values()) == lora.trainable_parameters(trained)


def test_saving_an_adapter_is_atomic(tmp_path, monkeypatch, tiny_gpt):
    """A save that dies midway (disk full, killed) leaves the adapter saved before intact."""
    trained = tiny_gpt()
    lora.add_lora(trained, TARGETS, 4, 8.0)
    path = lora.save_adapter(trained, tmp_path / "adapter.pt")
    before = path.read_bytes()

    def dies_midway(obj, f):
        open(f, "wb").write(b"half a file")
        raise OSError("No space left on device")

    monkeypatch.setattr(torch, "save", dies_midway)
    with_random_B(trained)
    with pytest.raises(OSError, match="No space"):
        lora.save_adapter(trained, path)
    assert path.read_bytes() == before


def test_an_adapter_fits_the_same_weights_computed_another_way(tmp_path, tiny_gpt):
    """The attention path and the dropout are not part of a model's identity: an adapter trained with
    PyTorch's kernel and dropout loads into the same weights run with the explicit softmax and none,
    and so does a file whose fingerprint still lists them (written before they were left out)."""
    trained = tiny_gpt(dropout=0.1)
    lora.add_lora(trained, TARGETS, 4, 8.0)
    with_random_B(trained)
    path = lora.save_adapter(trained, tmp_path / "adapter.pt")
    explicit = tiny_gpt(sdpa=False)
    assert lora.load_adapter(explicit, path) == list(lora.lora_layers(trained))
    idx = torch.randint(40, (2, 16))
    torch.testing.assert_close(explicit.eval()(idx)[0], trained.eval()(idx)[0], atol=1e-5, rtol=1e-5)
    old = torch.load(path, weights_only=True)
    old["model"]["config"].update(sdpa=True, dropout=0.1)
    torch.save(old, tmp_path / "old.pt")
    assert lora.load_adapter(tiny_gpt(), tmp_path / "old.pt") == list(lora.lora_layers(trained))


def test_adapter_for_another_model_is_a_one_line_error(tmp_path, tiny_gpt):
    trained = tiny_gpt()
    lora.add_lora(trained, TARGETS, 4, 8.0)
    path = lora.save_adapter(trained, tmp_path / "adapter.pt")
    other = tiny_gpt(d_model=64)
    with pytest.raises(lora.AdapterError, match=r"saved for another model \(d_model=32 there, 64 here\)") as info:
        lora.load_adapter(other, path)
    assert "\n" not in str(info.value)
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(lora.AdapterError, match="not an adapter file"):
        lora.load_adapter(tiny_gpt(), tmp_path / "junk.pt")
    with pytest.raises(FileNotFoundError, match="no adapter file"):
        lora.load_adapter(tiny_gpt(), tmp_path / "missing.pt")


@pytest.mark.parametrize("rank", [0, 33, 2.0])
def test_bad_rank_is_a_one_line_error(rank):
    with pytest.raises(ValueError, match=r"does not fit a 32→32 layer; use an int from 1 to min\(in, out\) = 32"):
        lora.LoRALinear(nn.Linear(32, 32), rank, 1.0)


def test_unknown_target_names_the_layers(tiny_gpt):
    with pytest.raises(ValueError, match="its linear layers end with: W_K, W_O, W_Q, W_V, W_in, W_out"):
        lora.add_lora(tiny_gpt(), "c_attn", 4, 8.0)


def test_adamw_state_shrinks_with_the_trained_parameters(tiny_gpt):
    full = tiny_gpt()
    adapted = tiny_gpt()
    lora.add_lora(adapted, TARGETS, 4, 8.0)
    idx = torch.randint(40, (2, 16))
    sizes = {}
    for name, model in (("full", full), ("lora", adapted)):
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
        model(idx[:, :-1], idx[:, 1:])[1].backward()
        opt.step()
        sizes[name] = lora.adamw_state_bytes(opt)
    # two float32 moments per trained number, plus one step counter per trained tensor
    n_full = sum(p.numel() for p in full.parameters())
    n_tensors = sum(1 for _ in full.parameters())
    assert sizes["full"] == 8 * n_full + 4 * n_tensors
    assert sizes["lora"] == 8 * lora.trainable_parameters(adapted) + 4 * 2 * 6


def test_adapting_only_the_top_block_keeps_the_blocks_below_out_of_the_backward_pass(tiny_gpt):
    # lesson 13: with adapters on the top block alone, nothing below it needs a gradient, so autograd
    # records no graph there and the backward pass stops at the lowest adapted block
    model = tiny_gpt(n_layers=4)
    lora.add_lora(model, "blocks.3.attn.W_Q", rank=2, alpha=4)
    recorded = []
    for block in model.blocks:
        block.register_forward_hook(lambda _m, _i, out: recorded.append(out.requires_grad))
    logits, _loss = model(torch.randint(0, 40, (2, 8)))
    logits.sum().backward()
    assert recorded == [False, False, False, True]
    assert all(p.grad is None for p in model.blocks[:3].parameters())
