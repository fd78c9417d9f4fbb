import math
import os
import subprocess
import sys
import time
from dataclasses import FrozenInstanceError, asdict, replace
from pathlib import Path

import pytest
import torch

from course_tools.cli import main as course
from course_utils import train as T
from course_utils.gpt import GPTConfig
from course_utils.tokenizer import CharTokenizer

ROOT = Path(__file__).resolve().parent.parent
TEXT = ("ROMEO:\nBut soft, what light through yonder window breaks?\nIt is the east, and Juliet is the sun.\n"
        "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?\n") * 40


def cfg(**kw) -> T.TrainConfig:
    base = dict(batch_size=4, max_iters=8, warmup_iters=2, eval_interval=4, eval_iters=2, log_interval=3)
    return T.TrainConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def data():
    tok = CharTokenizer(TEXT)
    ids = torch.tensor(tok.encode(TEXT))
    n = int(0.9 * len(ids))
    return tok, ids[:n], ids[n:]


def test_get_batch_windows_are_shifted_by_one():
    data = torch.arange(100)
    x, y = T.get_batch(data, 5, 8, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (5, 8)
    assert torch.equal(y, x + 1)  # contiguous windows of an arange
    assert torch.equal(x[:, 1:], x[:, :-1] + 1)


def test_ranks_split_one_global_batch():
    data = torch.arange(1000)
    whole, _ = T.get_batch(data, 6, 4, torch.Generator().manual_seed(3))
    parts = [T.get_batch(data, 3, 4, torch.Generator().manual_seed(3), rank=r, world_size=2)[0] for r in (0, 1)]
    assert torch.equal(torch.cat(parts), whole)


def test_get_batch_errors():
    with pytest.raises(ValueError, match="1-D"):
        T.get_batch(torch.zeros(2, 50, dtype=torch.long), 2, 4, torch.Generator())
    with pytest.raises(ValueError, match="smaller max_len"):
        T.get_batch(torch.arange(8), 2, 8, torch.Generator())


def test_lr_schedule_warms_up_then_follows_a_cosine():
    lrs = [T.lr_at(s, 100, 1.0, 0.1, 10) for s in range(110)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a < b for a, b in zip(lrs[:9], lrs[1:10], strict=True))
    assert all(a >= b for a, b in zip(lrs[10:100], lrs[11:101], strict=True))
    assert lrs[55] == pytest.approx(0.55)  # half way down the cosine: the mean of lr and min_lr
    assert lrs[100] == lrs[109] == 0.1


def test_weight_decay_only_on_matrices(tiny_gpt):
    model = tiny_gpt(vocab_size=10)
    opt = T.make_optimizer(model, cfg(weight_decay=0.1), torch.device("cpu"))
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in decay["params"]) and all(p.dim() == 1 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_cpu_defaults_are_float32_and_eager():
    assert T.autocast_dtype(T.TrainConfig(), torch.device("cpu")) == torch.float32
    assert T.autocast_dtype(T.TrainConfig(dtype="bfloat16"), torch.device("cpu")) == torch.float32


@pytest.mark.parametrize("field, bad, shown", [
    ("dtype", "fp8", "dtype must be one of auto, bfloat16, float32, got 'fp8'"),
    ("batch_size", 0, "batch_size must be at least 1, got 0"), ("eval_interval", 0, "eval_interval must be at least 1"),
    ("max_iters", -1, "max_iters must be >= 0"), ("time_budget", 0.0, "time_budget must be a positive number"),
    ("lr", 0.0, "need 0 <= min_lr <= lr and lr > 0"), ("min_lr", 1.0, "need 0 <= min_lr <= lr"),
    ("beta2", 1.0, "must lie in \\[0, 1\\)"), ("grad_clip", 0.0, "grad_clip must be positive")])
def test_train_config_is_validated_with_one_line_errors(field, bad, shown):
    with pytest.raises(ValueError, match=shown):
        T.TrainConfig(**{field: bad})
    with pytest.raises(ValueError, match=shown):  # replace() builds a new config, validated again
        replace(T.TrainConfig(), **{field: bad})


def test_both_configs_are_frozen_presets_of_the_same_kind():
    """GPTConfig and TrainConfig: frozen, a registry of instances each, the same preset(name, **overrides)
    and the same error for an unknown name."""
    from course_utils.config import PRESETS

    for config_class, registry in ((GPTConfig, PRESETS), (T.TrainConfig, T.TRAIN_PRESETS)):
        assert all(type(c) is config_class for c in registry.values())
        c = config_class.preset("smoke")
        assert c == registry["smoke"]
        with pytest.raises(FrozenInstanceError):
            c.seed = 1  # type: ignore[misc]
        with pytest.raises(ValueError, match=r"preset named 'huge'; known presets: .*smoke"):
            config_class.preset("huge")
        with pytest.raises(ValueError, match="spelled with underscores, use 'shakespeare_char'"):
            config_class.preset("shakespeare-char")
    assert T.TrainConfig.preset("cpu", lr=3e-3, max_iters=7) == replace(T.TRAIN_PRESETS["cpu"], lr=3e-3, max_iters=7)
    assert T.TRAIN_PRESETS["cpu"].lr == 1e-2  # the registry's instance is untouched


def test_a_checkpoint_in_the_old_format_still_resumes(data, tmp_path, tiny_gpt):
    """Checkpoints written before the history was typed hold a plain dict, and the oldest lack
    eval_elapsed: both resume, the missing list starting empty."""
    tok, train_data, val_data = data
    c = cfg(max_iters=6, eval_interval=3)
    T.train(tiny_gpt(vocab_size=tok.vocab_size), train_data, val_data, c, tokenizer=tok, out_dir=tmp_path, until=3,
            progress=False)
    ckpt = T.load_checkpoint(tmp_path / T.CHECKPOINT)
    assert isinstance(ckpt["history"], dict)  # a checkpoint stores plain lists (weights_only=True)
    old = {**ckpt, "history": {k: v for k, v in ckpt["history"].items() if k != "eval_elapsed"}}
    result = T.train(tiny_gpt(vocab_size=tok.vocab_size), train_data, val_data, c, resume=old, progress=False)
    h = result.history
    assert isinstance(h, T.History) and result.step == 6 and h.eval_step == [0, 3, 6]
    assert len(h.eval_elapsed) == 1 and len(h.val_loss) == 3  # eval_elapsed: only the evaluation after resuming
    with pytest.raises(T.CheckpointError, match="does not know \\(speed\\)"):
        T.History.from_dict({**ckpt["history"], "speed": []})


def test_loss_at_initialisation_is_about_ln_v(data, tiny_gpt):
    tok, train_data, _ = data
    model = tiny_gpt(vocab_size=tok.vocab_size)
    x, y = T.get_batch(train_data, 8, 16, torch.Generator().manual_seed(0))
    _, loss = model(x, y)
    assert abs(loss.item() - math.log(tok.vocab_size)) < 0.1


def test_training_lowers_the_loss_and_records_history(data, tmp_path, tiny_gpt):
    tok, train_data, val_data = data
    result = T.train(tiny_gpt(vocab_size=tok.vocab_size), train_data, val_data,
                     cfg(max_iters=60, lr=3e-3, eval_interval=30), tokenizer=tok, out_dir=tmp_path, progress=False)
    h = result.history
    assert result.step == 60 and h.step == list(range(60)) and len(h.loss) == len(h.lr) == 60
    assert h.eval_step == [0, 30, 60] and len(h.eval_elapsed) == len(h.eval_time) == 3
    assert h.val_loss[-1] < h.val_loss[0] - 0.8
    assert result.tokens_per_s > 0 and result.tflops > 0
    ckpt = T.load_checkpoint(tmp_path / T.CHECKPOINT)  # weights_only=True
    assert ckpt["step"] == 60 and ckpt["tokenizer"] == {"kind": "char", "chars": "".join(tok.chars)}
    assert not list(tmp_path.glob("*.tmp"))


def test_resume_gives_the_uninterrupted_curve(data, tmp_path, tiny_gpt):
    tok, train_data, val_data = data
    c = cfg(max_iters=10, eval_interval=4, log_interval=3)
    whole_model = tiny_gpt(vocab_size=tok.vocab_size, dropout=0.1)
    whole = T.train(whole_model, train_data, val_data, c, progress=False)
    first = T.train(tiny_gpt(vocab_size=tok.vocab_size, dropout=0.1), train_data, val_data, c, tokenizer=tok,
                    out_dir=tmp_path, until=5, progress=False)
    assert first.step == 5 and len(first.history.loss) == 5
    ckpt = T.load_checkpoint(tmp_path / T.CHECKPOINT)
    fresh = tiny_gpt(vocab_size=tok.vocab_size, dropout=0.1)
    torch.manual_seed(999)  # the checkpoint's RNG state must win over whatever came before
    second = T.train(fresh, train_data, val_data, c, resume=ckpt, out_dir=tmp_path, progress=False)
    assert second.history.loss == whole.history.loss  # exactly equal, dropout included
    assert second.history.val_loss == whole.history.val_loss
    assert second.history.lr == whole.history.lr
    for a, b in zip(fresh.state_dict().values(), whole_model.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_gradient_accumulation_matches_one_big_batch(data, tiny_gpt):
    tok, train_data, _ = data
    # 2 micro-batches of 4 equal one batch of 8 only if they are the same windows: draw 8, split
    model_a, model_b = tiny_gpt(vocab_size=tok.vocab_size), tiny_gpt(vocab_size=tok.vocab_size)
    x, y = T.get_batch(train_data, 8, 16, torch.Generator().manual_seed(0))
    model_a(x, y)[1].backward()
    for xs, ys in ((x[:4], y[:4]), (x[4:], y[4:])):
        (model_b(xs, ys)[1] / 2).backward()
    for pa, pb in zip(model_a.parameters(), model_b.parameters(), strict=True):
        torch.testing.assert_close(pa.grad, pb.grad, atol=1e-6, rtol=1e-5)


def test_time_budget_ends_on_time(data, tiny_gpt):
    tok, train_data, val_data = data
    start = time.perf_counter()
    result = T.train(tiny_gpt(vocab_size=tok.vocab_size), train_data, val_data,
                     cfg(max_iters=10_000, time_budget=3.0, eval_interval=10_000), progress=False)
    took = time.perf_counter() - start
    assert 2.0 < took < 5.0, took
    assert 3 < result.step < 10_000
    assert result.history.lr[-1] < 0.2 * result.history.lr[2]  # the cosine ran its course


HARNESS = """import sys
from course_tools.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "tiny.txt"
    path.write_text(TEXT * 5, encoding="utf-8")
    return path


def test_cli_train_resume_and_sample(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    common = ["train", "--data", str(corpus), "--config", "smoke", "--out", str(out), "--quiet"]
    threads = torch.get_num_threads()
    assert course(common + ["--max-iters", "6", "--threads", "1"]) == 0
    assert torch.get_num_threads() == 1
    torch.set_num_threads(threads)
    assert T.load_checkpoint(out / T.CHECKPOINT)["step"] == 6
    assert course(common + ["--resume", "--max-iters", "8", "--grad-accum", "2"]) == 0
    ckpt = T.load_checkpoint(out / T.CHECKPOINT)
    assert ckpt["step"] == 8 and ckpt["train_config"]["grad_accum"] == 2
    capsys.readouterr()
    assert course(["sample", "--ckpt", str(out / T.CHECKPOINT), "--prompt", "ROMEO:", "--max-new-tokens", "20"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("ROMEO:") and len(text.splitlines()[0]) >= len("ROMEO:")
    assert course(common[:-3] + ["--out", str(tmp_path / "bpe"), "--tokenizer", "bpe", "--bpe-vocab", "300",
                              "--max-iters", "2", "--quiet"]) == 0
    assert T.load_checkpoint(tmp_path / "bpe" / T.CHECKPOINT)["tokenizer"]["kind"] == "bpe"


def test_cli_rejects_both_budgets(corpus):
    with pytest.raises(SystemExit):
        course(["train", "--data", str(corpus), "--max-iters", "5", "--time-budget", "1m"])


def test_two_process_ddp_equals_one_process_with_the_whole_batch(corpus, tmp_path):
    """torchrun + gloo on the CPU: two processes with batch 4 each train exactly like one with 8."""
    harness = tmp_path / "course_cli.py"
    harness.write_text(HARNESS)
    args = ["train", "--data", str(corpus), "--config", "smoke", "--max-iters", "6", "--quiet"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env.pop("RANK", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(harness),
           *args, "--batch-size", "4", "--out", str(tmp_path / "ddp")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 process(es)" in proc.stdout
    assert course(args + ["--batch-size", "8", "--out", str(tmp_path / "one")]) == 0
    ddp = T.load_checkpoint(tmp_path / "ddp" / T.CHECKPOINT)
    one = T.load_checkpoint(tmp_path / "one" / T.CHECKPOINT)
    torch.testing.assert_close(torch.tensor(ddp["history"]["loss"]), torch.tensor(one["history"]["loss"]),
                               atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.tensor(ddp["history"]["val_loss"]), torch.tensor(one["history"]["val_loss"]),
                               atol=1e-5, rtol=1e-5)
    for name, p in one["model"].items():
        if name.endswith("W_K.bias"):
            # a key bias adds the same score to every key, which the softmax cancels: its gradient is
            # rounding noise, and Adam's normalisation turns noise into full-size steps
            continue
        torch.testing.assert_close(ddp["model"][name], p, atol=1e-5, rtol=1e-4, msg=name)
    assert asdict(T.TrainConfig(**ddp["train_config"]))["batch_size"] == 4


# --- lesson 08 exercises: references agree with PyTorch, hints name the mistake ---------------------
from course_tools.exercises.references import lesson08 as ex  # noqa: E402


def test_exercise_references_match_pytorch():
    grads = [torch.randn(3, 4) * 5, torch.randn(7)]
    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    for p, g in zip(params, grads, strict=True):
        p.grad = g.clone()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    for p, got in zip(params, ex.clip_gradients(grads, 1.0), strict=True):
        torch.testing.assert_close(got, p.grad)
    data, starts = torch.arange(100), torch.tensor([0, 5, 90])
    x, y = ex.shifted_windows(data, starts, 9)
    assert torch.equal(x[:, 0], starts) and torch.equal(y, x + 1) and x.shape == (3, 9)
    assert ex.perplexity(torch.zeros(4, 65), torch.zeros(4, dtype=torch.long)).item() == pytest.approx(65)


def test_exercise_hints(run_exercise):
    import torch.nn.functional as F

    def unshifted(data, starts, t):
        x = data[starts[:, None] + torch.arange(t)]
        return x, x

    assert "next token" in run_exercise("shifted_windows", unshifted).report()
    assert "exponential" in run_exercise("perplexity", lambda lg, t: F.cross_entropy(lg, t)).report()
    assert "in nats" in run_exercise("perplexity", lambda lg, t: 2 ** F.cross_entropy(lg, t)).report()
    off_by_one = lambda s, m, lr, lo, w: lr * s / w if s < w else T.lr_at(s, m, lr, lo, w)
    assert "off by one" in run_exercise("lr_schedule", off_by_one).report()
    to_zero = lambda s, m, lr, lo, w: T.lr_at(s, m, lr, 0.0, w)
    assert "end at min_lr" in run_exercise("lr_schedule", to_zero).report()

    greedy = lambda ids, p, n: [n if t == p[0] else t for t in ids if t != p[1]]
    assert "merged overlapping" in run_exercise("bpe_merge", greedy).report()
    per_tensor = lambda gs, m: [g * min(1.0, m / (g.norm() + 1e-6)) for g in gs]
    assert "global norm" in run_exercise("clip_gradients", per_tensor).report()
    always = lambda gs, m: [g * m / torch.sqrt(sum((x ** 2).sum() for x in gs)) for g in gs]
    assert "unchanged" in run_exercise("clip_gradients", always).report()


def test_a_failed_save_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / T.CHECKPOINT
    full = dict.fromkeys(T.CHECKPOINT_KEYS)  # load_checkpoint wants every key of a real checkpoint
    T.save_checkpoint(path, {**full, "step": 1, "w": torch.ones(3)})

    def crash(obj, f, *args, **kwargs):
        Path(f).write_bytes(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        T.save_checkpoint(path, {**full, "step": 2, "w": torch.zeros(3)})
    assert T.load_checkpoint(path)["step"] == 1


def test_a_budget_too_short_for_one_step_gives_no_speed(data, tiny_gpt):
    tok, train_data, val_data = data
    result = T.train(tiny_gpt(vocab_size=tok.vocab_size), train_data, val_data, cfg(time_budget=1e-3), progress=False)
    assert result.step == 0 and result.history.step == [] and result.history.eval_step == [0]
    assert math.isnan(result.tokens_per_s) and math.isnan(result.tflops)  # nothing was timed, nothing invented


def test_fewer_steps_than_one_log_interval_still_measure_the_speed(data, tiny_gpt):
    tok, train_data, val_data = data
    result = T.train(tiny_gpt(vocab_size=tok.vocab_size), train_data, val_data, cfg(max_iters=2, log_interval=10),
                     progress=False)
    assert result.step == 2 and len(result.history.loss) == 2
    assert math.isfinite(result.tokens_per_s) and result.tokens_per_s > 0
    assert result.history.tokens_per_s == [pytest.approx(result.tokens_per_s)]


def test_checkpoint_stores_the_tokenizer_through_its_interface(data, tmp_path, tiny_gpt):
    tok, train_data, val_data = data
    T.train(tiny_gpt(vocab_size=tok.vocab_size), train_data, val_data, cfg(max_iters=1), tokenizer=tok,
            out_dir=tmp_path, progress=False)
    model, again = T.load_model(tmp_path / T.CHECKPOINT, "cpu")
    assert type(again) is CharTokenizer and again.encode(TEXT) == tok.encode(TEXT)
    assert not model.training
    with pytest.raises(TypeError, match="CharTokenizer or BPETokenizer"):
        T.train(tiny_gpt(vocab_size=tok.vocab_size), train_data, val_data, cfg(max_iters=1), tokenizer=object(),
                progress=False)
    with pytest.raises(FileNotFoundError, match="train first"):
        T.load_checkpoint("/nonexistent/ckpt.pt")


def test_without_validation_data_nothing_is_evaluated(data, tiny_gpt):
    tok, train_data, _ = data
    result = T.train(tiny_gpt(vocab_size=tok.vocab_size), train_data, None, cfg(max_iters=12, eval_interval=5),
                     progress=False)
    assert result.step == 12 and result.history.eval_step == [] and math.isnan(result.val_loss)
    assert len(result.history.loss) == 12


def test_data_must_be_token_ids_or_a_batch_function(data, tiny_gpt):
    tok, _, _ = data
    with pytest.raises(ValueError, match="1-D tensor of token ids, got shape \\(3, 40\\); or pass a function"):
        T.train(tiny_gpt(vocab_size=tok.vocab_size), torch.zeros(3, 40, dtype=torch.long), None, cfg(max_iters=1),
                progress=False)


def test_a_batch_function_and_a_loss_function_train_any_model():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    target = torch.tensor([[1.0], [-2.0], [0.5], [3.0]])

    def draw(gen):
        x = torch.randn(16, 4, generator=gen)
        return x, x @ target

    def mse(m, x, y):
        return torch.nn.functional.mse_loss(m(x), y)

    result = T.train(model, draw, draw, cfg(max_iters=200, lr=5e-2, min_lr=5e-3, eval_interval=100, eval_iters=4,
                                           weight_decay=0.0), loss_fn=mse, where=T.Dist(), progress=False)
    assert result.history.val_loss[-1] < 0.01 * result.history.val_loss[0]
    assert math.isnan(result.tflops) and result.tokens_per_s > 0  # not a GPT: no FLOPs counted
