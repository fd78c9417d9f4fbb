"""The `course` command: subcommands are wired, doctor and run behave as documented."""

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from course_tools.cli import COMMANDS, main


def test_every_subcommand_has_help(capsys):
    for name in COMMANDS:
        with pytest.raises(SystemExit) as info:
            main([name, "--help"])
        assert info.value.code == 0
        assert f"usage: course {name}" in capsys.readouterr().out


def test_doctor_prints_one_line_per_check(capsys):
    assert main(["doctor"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines and all(line.startswith(("OK  ", "FAIL")) for line in lines)
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


def test_run_reports_a_failing_notebook(tmp_path, capsys):
    path = tmp_path / "00_broken.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("1 / 0")]), path)
    assert main(["run", "--mode", "cpu", str(path)]) == 1
    assert "error: ZeroDivisionError" in capsys.readouterr().out
