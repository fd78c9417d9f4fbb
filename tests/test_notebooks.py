"""Notebook hygiene: what nbval does not check (stored errors, run order, mode, paths, naming)."""

import re
from pathlib import Path

import nbformat
import pytest

from course_tools.exercises import checks

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("notebooks", "solutions", "exercises")
ALL = sorted(p for folder in FOLDERS for p in (ROOT / folder).glob("*.ipynb"))
EXECUTED = [p for p in ALL if p.parent.name in ("notebooks", "solutions")]
EXERCISES = sorted((ROOT / "exercises").glob("*.ipynb"))
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))
PRIVATE = re.compile(r"(/home/|/root/|/Users/|[A-Za-z]:\\\\Users|/tmp/|site-packages|/usr/lib/python)")


def ids(paths):
    return [str(p.relative_to(ROOT)) for p in paths]


def load(path):
    return nbformat.read(path, as_version=4)


def code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def output_text(output) -> str:
    if output.get("output_type") == "stream":
        return output.get("text", "")
    if output.get("output_type") == "error":
        return "\n".join(output.get("traceback", []))
    data = output.get("data", {})
    return "\n".join(v for k, v in data.items() if k.startswith("text/") and isinstance(v, str))


def test_there_are_notebooks():
    assert (ROOT / "notebooks" / "00_setup.ipynb").exists()
    assert EXECUTED and EXERCISES


@pytest.mark.parametrize("path", ALL, ids=ids(ALL))
def test_name_and_kernel(path):
    assert re.fullmatch(r"\d\d_[a-z0-9_]+\.ipynb", path.name), f"{path.name}: name lessons NN_topic.ipynb"
    nb = load(path)
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3", f"{path.name}: kernelspec must be python3"


@pytest.mark.parametrize("path", ALL, ids=ids(ALL))
def test_no_stored_errors(path):
    for i, cell in enumerate(code_cells(load(path))):
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        assert not errors, f"{path.name}: code cell {i} has a stored error output ({errors[0].get('ename')})"


@pytest.mark.parametrize("path", EXECUTED, ids=ids(EXECUTED))
def test_executed_in_order_by_a_real_run(path):
    nb = load(path)
    mode = nb.metadata.get("course", {}).get("mode")
    assert mode in ("cpu", "gpu"), f"{path.name}: stored outputs must come from `course run --mode cpu|gpu`, got {mode}"
    counts = [c.execution_count for c in code_cells(nb)]
    assert counts == list(range(1, len(counts) + 1)), f"{path.name}: execution counts {counts} are not 1..n"


@pytest.mark.parametrize("path", EXECUTED, ids=ids(EXECUTED))
def test_no_private_paths(path):
    for i, cell in enumerate(load(path).cells):
        texts = [cell.source] + [output_text(o) for o in cell.get("outputs", [])]
        for text in texts:
            match = PRIVATE.search(text)
            assert not match, f"{path.name}: cell {i} shows a machine-specific path ({match.group(0)}...)"


@pytest.mark.parametrize("path", EXERCISES, ids=ids(EXERCISES))
def test_exercises_carry_no_outputs(path):
    for i, cell in enumerate(code_cells(load(path))):
        assert not cell.outputs and cell.execution_count is None, f"{path.name}: cell {i} carries outputs"


def test_every_lesson_is_in_the_readme_course_map():
    readme = (ROOT / "README.md").read_text()
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        assert f"notebooks/{path.name}" in readme, f"README course map lacks notebooks/{path.name}"


def test_every_solution_has_a_lesson_and_an_exercise():
    for path in SOLUTIONS:
        assert (ROOT / "notebooks" / path.name).exists(), f"solutions/{path.name} has no lesson notebook"
        assert (ROOT / "exercises" / path.name).exists(), f"exercises/{path.name} missing: run `course assign`"


# Answer cells checked together by stages instead of one exercise each: the capstone's classes and loop.
CHECKED_BY_STAGES = {"11_build_your_gpt": {"my_attention", "my_block", "my_gpt", "my_training_loop", "my_generate",
                                           # the from-the-metal track's answer cells, checked by its metal_* stages
                                           "metal_layers", "metal_losses", "metal_optimizer", "metal_step_tools",
                                           "metal_model", "metal_loop"},
                     # lesson 12's LLaMA: the mapping, the model and the decoding loop, checked by its llama_* stages
                     "12_real_llm": {"my_mapping", "my_llama", "my_decoding"}}


@pytest.mark.parametrize("path", SOLUTIONS, ids=ids(SOLUTIONS))
def test_exercise_cells_are_registered_and_checked(path):
    nb = load(path)
    answers, graded = {}, {}
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader")
        if not meta:
            continue
        if meta.get("solution") and cell.cell_type == "code":  # markdown answers are graded by hand
            answers[meta["grade_id"]] = cell
        if meta.get("grade"):
            graded[meta["grade_id"]] = (meta, cell)
    assert answers, f"{path.name}: no exercises"
    for name, cell in answers.items():
        assert "### BEGIN SOLUTION" in cell.source, f"{path.name}: answer {name} has no solution region"
        if name in CHECKED_BY_STAGES.get(path.stem, ()):
            continue
        checks.get(name)  # raises if the exercise is not registered
        assert f"{name}_check" in graded, f"{path.name}: answer {name} has no check cell {name}_check"
        meta, check_cell = graded[f"{name}_check"]
        assert meta.get("points", 0) > 0 and meta.get("locked"), f"{path.name}: {name}_check needs points and locked"
        assert f"check.{name}(" in check_cell.source, f"{path.name}: {name}_check must call check.{name}(...)"
        assert meta.get("schema_version") == 3


def test_a_kernel_that_dies_at_start_is_started_again_but_not_forever():
    import importlib.util

    import nbval.kernel

    # the course's root conftest.py, by path: "conftest" may name another folder's in a full run
    spec = importlib.util.spec_from_file_location("course_root_conftest", ROOT / "conftest.py")
    root_conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(root_conftest)
    retrying_kernel_start = root_conftest.retrying_kernel_start
    wrapped = nbval.kernel.start_new_kernel
    assert hasattr(wrapped, "__wrapped__") and not hasattr(wrapped.__wrapped__, "__wrapped__")  # wrapped once
    calls = []

    def dies(times):
        def start(**kwargs):
            calls.append(kwargs)
            if len(calls) <= times:
                raise RuntimeError("Kernel died before replying to kernel_info")
            return "km", "kc"
        return start

    assert retrying_kernel_start(dies(2))(kernel_name="k") == ("km", "kc") and len(calls) == 3
    calls.clear()
    with pytest.raises(RuntimeError, match="died"):
        retrying_kernel_start(dies(3))(kernel_name="k")
    assert len(calls) == 3
    calls.clear()

    def other(**kwargs):
        calls.append(kwargs)
        raise RuntimeError("no such kernel")

    with pytest.raises(RuntimeError, match="no such kernel"):
        retrying_kernel_start(other)()
    assert len(calls) == 1
