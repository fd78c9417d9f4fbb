"""The `course` command: subcommands are wired, doctor and run behave as documented; the developers'
`course-dev` is wired too, and `course` offers none of its tools."""

import argparse
import json

import nbformat
import pytest
import torch
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from course_tools import dev
from course_tools.cli import COMMANDS, main
from course_tools.cli.run import SLOW_CELL_S, coalesce_streams


def test_every_subcommand_has_help(capsys):
    for name in COMMANDS:
        with pytest.raises(SystemExit) as info:
            main([name, "--help"])
        assert info.value.code == 0
        assert f"usage: course {name}" in capsys.readouterr().out


def test_every_course_dev_command_has_help(capsys):
    """Down to the leaves: ``course-dev bench cpu --help`` as well as ``course-dev bench --help``."""
    def walk(words: list[str], parser: argparse.ArgumentParser) -> list[list[str]]:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        return [words] + [w for a in subs for name, child in a.choices.items() for w in walk([*words, name], child)]

    commands = walk([], dev.parser())[1:]
    assert ["bench", "llama-cpp"] in commands and ["bench", "group-sampling"] in commands and ["gpu-check"] in commands
    assert len(commands) == 6
    for words in commands:
        with pytest.raises(SystemExit) as info:
            dev.main([*words, "--help"])
        assert info.value.code == 0
        assert f"usage: course-dev {' '.join(words)}" in capsys.readouterr().out


def test_course_offers_no_developer_tool(capsys):
    assert not set(COMMANDS) & set(dev.COMMANDS)
    with pytest.raises(SystemExit):
        main(["bench", "--cpu"])
    assert "invalid choice: 'bench'" in capsys.readouterr().err


def test_doctor_prints_one_line_per_check(capsys):
    assert main(["doctor"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines and all(line.startswith(("OK  ", "FAIL", "NOTE")) for line in lines)
    assert any("torch" in line for line in lines) and any("run mode" in line for line in lines)


def test_run_executes_records_mode_and_refuses_smoke_outputs(tmp_path, capsys):
    path = tmp_path / "00_demo.ipynb"
    nb = new_notebook(cells=[new_code_cell("from course_utils import runtime\nprint(runtime.mode())")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    with pytest.raises(SystemExit, match="cpu or gpu"):
        main(["run", "--mode", "smoke", "--inplace", str(path)])
    assert main(["run", "--mode", "cpu", "--inplace", str(path)]) == 0
    out = capsys.readouterr().out
    assert "00_demo.ipynb" in out and " ok" in out
    done = nbformat.read(path, as_version=4)
    assert done.metadata["course"]["mode"] == "cpu"
    assert done.cells[0].outputs[0]["text"] == "cpu\n" and done.cells[0].execution_count == 1


def test_run_timings_name_the_slow_cells_and_their_section(tmp_path, capsys):
    path = tmp_path / "00_slow.ipynb"
    nb = new_notebook(cells=[new_markdown_cell("Intro.\n\n## 1. Waiting\n\nText."),
                             new_code_cell("import time\ntime.sleep(5.3)"), new_code_cell("x = 1")])
    nbformat.write(nb, path)
    timings = tmp_path / "t.json"
    assert main(["run", "--mode", "cpu", "--timings", str(timings), str(path)]) == 0
    out = capsys.readouterr().out
    [row] = json.loads(timings.read_text())
    sleeper = row["cells"][0]
    assert [c["index"] for c in row["cells"]] == [1, 2] and sleeper["section"] == "1. Waiting"
    assert sleeper["seconds"] >= 5.3  # it slept that long, however busy the machine
    assert f"slow cell 1 ({sleeper['seconds']:.1f} s) in '1. Waiting': import time" in out
    # slow means over the threshold, whatever the load did to the quick cell's time
    assert row["slow_cells"] == [c for c in row["cells"] if c["seconds"] > SLOW_CELL_S] and row["load_before"] >= 0
    assert "execution" not in nbformat.read(path, as_version=4).cells[1].metadata  # nothing timed is stored


def test_run_reports_a_failing_notebook(tmp_path, capsys):
    path = tmp_path / "00_broken.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("1 / 0")]), path)
    assert main(["run", "--mode", "cpu", str(path)]) == 1
    assert "error: ZeroDivisionError" in capsys.readouterr().out


# --- course train / course sample: a user's mistake is one line naming the fix ------------------------
from course_tools.cli import train as train_command  # noqa: E402
from course_utils import train  # noqa: E402

TEXT = "ROMEO:\nBut soft, what light through yonder window breaks?\nIt is the east, and Juliet is the sun.\n" * 30


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A real ckpt.pt from a two-step run."""
    folder = tmp_path_factory.mktemp("run")
    (folder / "text.txt").write_text(TEXT, encoding="utf-8")
    assert main(["train", "--data", str(folder / "text.txt"), "--config", "smoke", "--max-iters", "2",
                 "--out", str(folder), "--quiet"]) == 0
    return folder / train.CHECKPOINT


def one_line_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert lines[0].startswith(f"course {argv[0]}: error: ")
    return lines[0]


def test_train_missing_empty_and_short_texts(tmp_path, capsys):
    assert "no text file at" in one_line_error(capsys, ["train", "--data", str(tmp_path / "nope.txt")])
    (tmp_path / "empty.txt").write_text("  \n", encoding="utf-8")
    assert "holds no text" in one_line_error(capsys, ["train", "--data", str(tmp_path / "empty.txt")])
    (tmp_path / "short.txt").write_text("To be, or not to be.\n" * 3, encoding="utf-8")
    line = one_line_error(capsys, ["train", "--data", str(tmp_path / "short.txt"), "--config", "smoke"])
    assert "too few for windows" in line and "use a text of at least" in line
    (tmp_path / "binary.txt").write_bytes(b"\xff\xfe\x00garbage")
    assert "not UTF-8 text" in one_line_error(capsys, ["train", "--data", str(tmp_path / "binary.txt")])


def test_train_bad_duration_is_one_line(tmp_path, capsys):
    (tmp_path / "text.txt").write_text(TEXT, encoding="utf-8")
    for bad in ("5 minutes", "0", "-3s"):
        line = one_line_error(capsys, ["train", "--data", str(tmp_path / "text.txt"), f"--time-budget={bad}"])
        assert "90s, 5m or 1.5h" in line


def test_parse_duration():
    parse = train_command.parse_duration
    assert parse("110s") == 110 and parse("5m") == 300 and parse("1.5h") == 5400 and parse("90") == 90
    assert parse(2) == 2


def test_train_resume_without_a_checkpoint(tmp_path, capsys):
    (tmp_path / "text.txt").write_text(TEXT, encoding="utf-8")
    line = one_line_error(capsys, ["train", "--data", str(tmp_path / "text.txt"), "--resume", "--out", str(tmp_path)])
    assert "no checkpoint at" in line and "train first" in line


@pytest.mark.parametrize("content", [b"", b"PK\x03\x04 half a zip", b"\x80\x02}q\x00.", b"plain text\n"])
def test_sample_rejects_files_that_are_not_checkpoints(tmp_path, capsys, content):
    path = tmp_path / "ckpt.pt"
    path.write_bytes(content)
    line = one_line_error(capsys, ["sample", "--ckpt", str(path)])
    assert "is not a readable checkpoint" in line
    assert not any(word in line for word in ("PytorchStreamReader", "zip archive", "Unpickl", "opcode"))


def test_sample_rejects_a_torch_file_that_is_not_a_checkpoint(tmp_path, capsys):
    torch.save({"weight": torch.ones(2)}, tmp_path / "state.pt")
    line = one_line_error(capsys, ["sample", "--ckpt", str(tmp_path / "state.pt")])
    assert "is not a checkpoint of course train" in line and "model_config" in line
    assert "no checkpoint at" in one_line_error(capsys, ["sample", "--ckpt", str(tmp_path / "missing.pt")])


def test_sample_unreadable_checkpoint(tmp_path, capsys, monkeypatch, checkpoint):
    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(torch, "load", denied)  # chmod 000 does not stop root, who may run the tests
    assert "cannot read" in one_line_error(capsys, ["sample", "--ckpt", str(checkpoint)])


def test_sample_prompt_with_an_unknown_character(capsys, checkpoint):
    line = one_line_error(capsys, ["sample", "--ckpt", str(checkpoint), "--prompt", "§"])
    assert "was not in the text this tokenizer was built from" in line


def test_a_time_budget_too_short_for_one_step_reports_no_speed(tmp_path, capsys):
    (tmp_path / "text.txt").write_text(TEXT, encoding="utf-8")
    assert main(["train", "--data", str(tmp_path / "text.txt"), "--config", "smoke", "--time-budget", "0.001",
                 "--out", str(tmp_path), "--quiet"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert "nan" not in last and "no training step ran" in last and "--time-budget" in last
    assert last.startswith("step 0: val loss ")


def test_train_resume_from_a_checkpoint_without_a_tokenizer(tmp_path, capsys, checkpoint):
    state = train.load_checkpoint(checkpoint)
    train.save_checkpoint(tmp_path / train.CHECKPOINT, {**state, "tokenizer": None})
    (tmp_path / "text.txt").write_text(TEXT, encoding="utf-8")
    line = one_line_error(capsys, ["train", "--data", str(tmp_path / "text.txt"), "--resume", "--out", str(tmp_path)])
    assert "holds no tokenizer" in line and "without --resume" in line
    assert "holds no tokenizer" in one_line_error(capsys, ["sample", "--ckpt", str(tmp_path / train.CHECKPOINT)])


def test_stored_outputs_join_a_print_the_kernel_flushed_in_pieces():
    """A reveal whose last newline arrived as a second stdout message (lesson 01, cell 50ee9fd3, in one
    run) is stored as one stream, as Jupyter shows it; stderr and a display between stay apart."""
    from nbformat.v4 import new_output

    cell = new_code_cell("print(1)")
    cell.outputs = [new_output("stream", name="stdout", text="measured: 4.159\nwhy: ..."),
                    new_output("stream", name="stdout", text="\n"),
                    new_output("stream", name="stderr", text="warning\n"),
                    new_output("display_data", data={"text/plain": "x"}),
                    new_output("stream", name="stdout", text="after\n")]
    nb = new_notebook(cells=[new_markdown_cell("# t"), cell])
    coalesce_streams(nb)
    assert [(o.output_type, o.get("name"), o.get("text")) for o in nb.cells[1].outputs] == [
        ("stream", "stdout", "measured: 4.159\nwhy: ...\n"), ("stream", "stderr", "warning\n"),
        ("display_data", None, None), ("stream", "stdout", "after\n")]
