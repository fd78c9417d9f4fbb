"""Build the GPT that ships with the course: train it with ``course train``, then write its files.

    python -m course_tools.shipped_model                      # train (about an hour on 1 CPU thread), then export
    python -m course_tools.shipped_model --checkpoint PATH    # export a run of the same command

The export keeps only what generation needs (weights, sizes, tokenizer) in
``course_utils/pretrained/NAME.pt`` and writes the card ``NAME.json`` beside it: the training
command, the sizes, the validation loss on the fixed slice, the sha256 and the date.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch

from course_utils import counting, data, pretrained, train

NAME = "shakespeare_char_small"
TRAIN_ARGS = ["--data", "shakespeare", "--config", NAME, "--threads", "1", "--quiet"]


def train_command(out: Path) -> list[str]:
    """The exact ``course train`` call that produces the shipped model."""
    return [sys.executable, "-m", "course_tools.cli", "train", *TRAIN_ARGS, "--out", str(out)]


def export(checkpoint: Path, name: str = NAME, folder: Path = pretrained.FOLDER) -> dict:
    """Write NAME.pt (weights, config, tokenizer) and NAME.json (the card); return the card."""
    ckpt = train.load_checkpoint(checkpoint)
    if ckpt["step"] < ckpt["train_config"]["max_iters"]:
        raise ValueError(f"{checkpoint} stopped at step {ckpt['step']} of {ckpt['train_config']['max_iters']}; "
                         "let the run finish (course train ... --resume) before shipping it")
    target = folder / f"{name}.pt"
    torch.save({"model": ckpt["model"], "model_config": ckpt["model_config"], "tokenizer": ckpt["tokenizer"]},
               target)
    digest = pretrained.sha256_of(target)
    (folder / f"{name}.json").write_text(json.dumps({"file": target.name, "sha256": digest}))
    model, tokenizer = pretrained.load(name)  # read back the way learners will
    history = train.History.from_dict(ckpt["history"])
    last = {"train_loss": round(history.train_loss[-1], 4), "val_loss": round(history.val_loss[-1], 4)}
    info = {
        "name": name,
        "file": target.name,
        "sha256": digest,
        "size_bytes": target.stat().st_size,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "command": "course train " + " ".join(a for a in TRAIN_ARGS if a != "--quiet"),
        "rebuild": "python -m course_tools.shipped_model",
        "corpus_sha256": data.CORPUS_SHA256,
        "parameters": counting.count_params(model.config),
        "model_config": ckpt["model_config"],
        "train_config": ckpt["train_config"],
        "steps": ckpt["step"],
        "train_seconds": round(ckpt["elapsed"], 1),
        "trained_on": f"{platform.machine()} CPU, 1 thread, torch {torch.__version__}",
        "last_estimate": {**last, "note": "random batches of the training run (train.estimate_loss)"},
        "validation_loss": round(pretrained.validation_loss(model, tokenizer), 6),
        "validation_slice": f"the first {pretrained.SLICE_WINDOWS} non-overlapping windows of "
                            f"{model.config.max_len} characters of the validation part (last 10 %) of the corpus",
    }
    (folder / f"{name}.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_tools.shipped_model", description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, help="export this ckpt.pt instead of training")
    parser.add_argument("--out", type=Path, default=Path("runs") / NAME, help="training folder (default runs/NAME)")
    args = parser.parse_args(argv)
    checkpoint = args.checkpoint
    if checkpoint is None:
        subprocess.run(train_command(args.out), check=True)
        checkpoint = args.out / train.CHECKPOINT
    try:
        info = export(checkpoint)
    except (OSError, ValueError) as err:
        print(f"{parser.prog}: error: {err}", file=sys.stderr)
        return 2
    print(json.dumps({k: info[k] for k in ("file", "sha256", "steps", "validation_loss")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
