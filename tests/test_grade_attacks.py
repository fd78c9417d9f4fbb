"""`course grade` against hostile submissions: one per attack class of issue 21, written for these tests.

The sandbox tests need bubblewrap and run for real in CI (which installs it); elsewhere they are
skipped with the reason. The attacks share one folder run (``attacked``), graded four at a time.
"""

import contextlib
import csv
import io
import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import nbformat
import pytest
from test_grade import FULL, RIGHT, SOLUTION, submission

from course_tools.cli import main
from course_tools.grading import sandbox as sandboxing
from course_tools.grading.sandbox import Caps, Sandbox, SandboxError

pytestmark = pytest.mark.slow  # the attacks are graded in sandboxes, a class at a time
ROOT = Path(__file__).resolve().parent.parent


def _sandbox_problem() -> str | None:
    try:
        Sandbox(Caps()).check()
    except SandboxError as exc:
        return str(exc)
    return None


PROBLEM = _sandbox_problem()
needs_sandbox = pytest.mark.skipif(PROBLEM is not None and not os.environ.get("CI"),
                                   reason=f"no sandbox here: {PROBLEM}")
SECRET_ENV = "COURSE_ATTACK_GRADER_SECRET"
MARK = "course-attack-" + "secret-7f3a"  # written into one submission; nobody else may find it
OK = {name: RIGHT[name] for name in ("flatten_tokens", "mean_over_time", "pairwise_dots")}


def answers(**sources):
    """A submission: the given answer cells, the others right."""
    return submission({**OK, **sources})


def reporter(name, body):
    """An answer whose function raises with what ``body`` (code that sets ``seen``) observed;
    the message comes back as the exercise's status, which is how an attack would leak data.
    ``body`` runs once, on the first case (the other cases repeat its answer), so the work an
    attack does, and with it the time it needs under a busy machine, does not grow with the cases."""
    indented = "\n".join("        " + line for line in body.strip().splitlines())
    return (f"_seen_{name} = []\n\n\ndef {name}(*args):\n    if not _seen_{name}:\n{indented}\n"
            f"        _seen_{name}.append(seen)\n    raise RuntimeError('seen ' + str(_seen_{name}[0]))\n")


PROCESSES = reporter("flatten_tokens", """
import os
cmds = []
for pid in os.listdir('/proc'):
    if pid.isdigit():
        try:
            cmds.append(open(f'/proc/{pid}/cmdline', 'rb').read().replace(b'\\0', b' ').decode())
        except OSError:
            pass
seen = {'pids': len(cmds), 'grader': any('pytest' in c or 'course_tools.cli' in c for c in cmds),
        'tmp': sorted(os.listdir('/tmp'))}
""")
FILES = reporter("mean_over_time", """
import os, socket, sys, course_utils
mark = 'course-attack-' + 'secret-7f3a'
found = []
python = {sys.prefix, sys.base_prefix}  # a virtual environment under /tmp is mounted there: no submission is in it
for top in ('/tmp', '/home', '/job', os.path.dirname(os.path.dirname(course_utils.__file__))):
    for folder, subfolders, names in os.walk(top):
        subfolders[:] = [d for d in subfolders if os.path.join(folder, d) not in python]
        for n in names:
            try:
                if mark in open(os.path.join(folder, n), errors='ignore').read(10**6):
                    found.append(n)
            except OSError:
                pass
try:
    socket.create_connection(('1.1.1.1', 53), timeout=1)
    net = 'connected'
except OSError as exc:
    net = type(exc).__name__
chunk, written = b'x' * (1 << 20), 0
try:
    with open('/tmp/fill', 'wb') as f:
        while written < 300:
            f.write(chunk)
            written += 1
    tmp = 'wrote 300 MB'
except OSError as exc:
    tmp = type(exc).__name__
seen = {'found': found, 'net': net, 'tmp': tmp}
""")
ENVIRONMENT = reporter("pairwise_dots", """
import os
seen = {'count': len(os.environ), 'secret': [k for k in os.environ if 'SECRET' in k or 'PYTEST' in k],
        'home': os.environ.get('HOME')}
""")
VICTIM_SOURCE = f"# {MARK}\n" + RIGHT["flatten_tokens"]

VANDAL = reporter("mean_over_time", """
import os, site, course_utils, course_tools.grading
root = os.path.dirname(os.path.dirname(course_utils.__file__))
grading = os.path.dirname(course_tools.grading.__file__)
targets = {'course_utils': course_utils.__file__, 'worker': os.path.join(grading, 'worker.py'),
           'pth': os.path.join(site.getsitepackages()[0], 'zz_course_attack.pth'),
           'exercises': os.path.join(root, 'exercises', '00_setup.ipynb'),
           'startup': os.path.expanduser('~/.ipython/profile_default/startup/00-course-attack.py')}
seen = {}
for key, path in targets.items():
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, 'a').write('\\nraise SystemExit  # course-attack\\n')
        seen[key] = 'written'
    except OSError as exc:
        seen[key] = type(exc).__name__
""")
DAEMON = ("import subprocess, sys\n"
          "subprocess.Popen([sys.executable, '-c', 'import time\\nwhile True: time.sleep(1)  # course-attack-daemon'],"
          " start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
          + RIGHT["flatten_tokens"])
REFERENCES = "from course_tools.exercises.references.lesson00 import flatten_tokens\n"
SNEAKY = reporter("mean_over_time", """
import importlib, os, course_tools
seen = []
try:
    importlib.import_module('course_tools.' + 'refer' + 'ences.lesson00')
    seen.append('imported')
except ImportError as exc:
    seen.append('ImportError')
try:
    open(os.path.join(os.path.dirname(course_tools.__file__), 'refer' + 'ences', 'lesson00.py')).read()
    seen.append('read')
except OSError as exc:
    seen.append(type(exc).__name__)
""")
UNPICKLED = Path("/tmp/course-attack-unpickled")  # in the grader's /tmp: only an unpickling grader makes it
FORGER = f"""import json, pickle, struct

class _Payload:  # unpickled, this would make UNPICKLED in the unpickling process's /tmp
    def __reduce__(self):
        return (open, ({str(UNPICKLED)!r}, 'w'))

def _safetensors(header, data):
    raw = json.dumps(header).encode()
    return struct.pack('<Q', len(raw)) + raw + data

def _forge(name, function):
    path = f'/job/out/{{name}}.safetensors'
    if name == 'flatten_tokens':  # a pickle where the results go
        open(path, 'wb').write(pickle.dumps({{'kind': 'cases', 'results': [_Payload()]}}))
    elif name == 'mean_over_time':  # the kind flag is a tensor
        document = {{'dict': {{'kind': {{'tensor': 't0'}}, 'results': []}}}}
        header = {{'__metadata__': {{'value': json.dumps(document)}},
                  't0': {{'dtype': 'F32', 'shape': [3], 'data_offsets': [0, 12]}}}}
        open(path, 'wb').write(_safetensors(header, bytes(12)))
    else:  # 4 bytes of data that claim 2**30 elements
        header = {{'__metadata__': {{'value': '[]'}},
                  't0': {{'dtype': 'F32', 'shape': [2**30], 'data_offsets': [0, 4]}}}}
        open(path, 'wb').write(_safetensors(header, bytes(4)))
    open('/job/out/run.json', 'wb').write(b'\\0garbage{{')

_course_answer = _forge
""" + RIGHT["flatten_tokens"]
FIFO = "import os\nos.mkfifo('/job/out/flatten_tokens.safetensors')\n" + RIGHT["flatten_tokens"]
FLOOD = ("from IPython.display import display\n"
         "display({'text/plain': 'x' * (64 << 20)}, raw=True)\n" + RIGHT["flatten_tokens"])
FORKS = reporter("flatten_tokens", """
import subprocess
kids = []
try:
    for _ in range(200):
        kids.append(subprocess.Popen(['sleep', '60']))
except OSError as exc:
    pass
seen = {'spawned': len(kids)}
""")
HOG = reporter("mean_over_time", """
import subprocess, sys
code = "import time\\nb = b'x' * (700 << 20)\\ntime.sleep(3)"
kids = [subprocess.Popen([sys.executable, '-c', code]) for _ in range(3)]
seen = {'held': sum(k.wait() == 0 for k in kids)}
""")
DEAF = ("import signal\n"  # ipykernel restores SIGINT before each cell, so the answer ignores it while it runs
        "def flatten_tokens(x):\n    signal.signal(signal.SIGINT, signal.SIG_IGN)\n    while True:\n        pass\n")
FREEZER = ("import os, signal\n"
           "def flatten_tokens(x):\n    os.kill(os.getppid(), signal.SIGSTOP)\n    while True:\n        pass\n")
NOTEBOOK_LIMIT = 90


ANSI = "def mean_over_time(x):\n    raise ValueError('\\x1b[2J\\x1b[31mred\\x07 \\x1b]0;title\\x07done')\n"


def nested(depth):
    nb = submission(OK)
    raw = json.dumps(nb)
    return raw.replace('"metadata": {', '"metadata": {"deep": ' + "[" * depth + "]" * depth + ", ", 1).encode()


def retyped(edit):
    nb = json.loads(json.dumps(submission(OK)))
    edit(nb)
    return json.dumps(nb).encode()


def _set(path, value):
    def edit(nb):
        target = nb
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return edit


def _answer_cell(nb, grade_id):
    return next(i for i, c in enumerate(nb["cells"]) if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id)


def _retype_grade_id(nb):
    nb["cells"][_answer_cell(nb, "flatten_tokens")]["metadata"]["nbgrader"]["grade_id"] = ["flatten_tokens"]


def _retype_nbgrader(nb):
    nb["cells"][_answer_cell(nb, "mean_over_time")]["metadata"]["nbgrader"] = "solution"


ATTACKS = {
    "aaa_vandal": answers(mean_over_time=VANDAL),
    "daemon": answers(flatten_tokens=DAEMON),
    "peek": answers(flatten_tokens=PROCESSES, mean_over_time=FILES, pairwise_dots=ENVIRONMENT),
    "references": answers(flatten_tokens=REFERENCES),
    "sneaky": answers(mean_over_time=SNEAKY),
    "forger": answers(flatten_tokens=FORGER),
    "fifo": answers(flatten_tokens=FIFO),
    "flood": answers(flatten_tokens=FLOOD),
    "forks": answers(flatten_tokens=FORKS),
    "hog": answers(mean_over_time=HOG),
    "=HYPERLINK(1)+2": answers(mean_over_time=ANSI),
    "deaf": answers(flatten_tokens=DEAF),
    "freezer": answers(flatten_tokens=FREEZER),
    "zzz_victim": submission({**OK, "flatten_tokens": VICTIM_SOURCE}, base=SOLUTION),
}
ODD_FILES = {
    "deep": nested(100_000),
    "bigint": b'{"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [], "x": ' + b"9" * 5000 + b"}",
    "course_string": retyped(_set(["metadata", "course"], "00_setup")),
    "lesson_list": retyped(_set(["metadata", "course", "lesson"], ["00_setup"])),
    "grade_id_list": retyped(_retype_grade_id),
    "nbgrader_string": retyped(_retype_nbgrader),
    "many_cells": json.dumps(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("") for _ in range(3000)]))
    .encode(),
    "huge": b'{"cells": [], "nbformat": 4, "pad": "' + b"x" * (17 << 20) + b'"}',
}


def _grade(folder, out, *options):
    """Grade a folder with a secret in the grader's environment; return (rows by student, printed text)."""
    args = ["grade", str(folder), "--gradebook", str(out / "gradebook.csv"), "--json", str(out / "results.json"),
            "--feedback", str(out / "feedback"), *options]
    os.environ[SECRET_ENV] = "grader-only"
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            code = main(args)
    finally:
        os.environ.pop(SECRET_ENV, None)
    assert code == 0
    return {r["student"]: r for r in json.loads((out / "results.json").read_text())}, printed.getvalue()


@pytest.fixture(scope="module")
def attacked(tmp_path_factory):
    if PROBLEM:
        pytest.fail(f"CI must run the sandbox: {PROBLEM}")
    folder = tmp_path_factory.mktemp("attacks")
    for name, nb in ATTACKS.items():
        nbformat.write(nb, folder / f"{name}.ipynb")
    for name, raw in ODD_FILES.items():
        (folder / f"{name}.ipynb").write_bytes(raw)
    os.mkfifo(folder / "pipe.ipynb")
    (folder / "link.ipynb").symlink_to("/etc/passwd")
    out = tmp_path_factory.mktemp("attacks-out")
    UNPICKLED.unlink(missing_ok=True)
    before = {p: p.read_bytes() for p in (ROOT / "course_utils" / "__init__.py", ROOT / "exercises" / "00_setup.ipynb")}
    # 60 s a cell: the heaviest reporter (a walk of the mounted folders, a socket, a /tmp fill) needs about a
    # second of CPU, and four jobs on two cores at load 20 give each about a tenth of a core; the looping
    # answers (deaf, freezer) still end at the notebook limit, which is what their test measures.
    rows, printed = _grade(folder, out, "--jobs", "4", "--cell-timeout", "60", "--memory-mb", "2048",
                           "--notebook-timeout", str(NOTEBOOK_LIMIT), "--max-processes", "64", "--seed", "3")
    return {"rows": rows, "out": out, "before": before, "printed": printed}


@needs_sandbox
def test_no_other_process_is_visible_and_tmp_is_private(attacked, leaked):
    seen = eval(leaked(attacked["rows"]["peek"], "flatten_tokens"))  # noqa: S307  (our own test's report)
    assert seen["grader"] is False and seen["pids"] < 30
    assert not any(name.startswith("course-grade-job") for name in seen["tmp"])


@needs_sandbox
def test_other_submissions_are_invisible_and_network_and_tmp_are_capped(attacked, leaked):
    seen = eval(leaked(attacked["rows"]["peek"], "mean_over_time"))  # noqa: S307
    assert seen == {"found": [], "net": seen["net"], "tmp": "OSError"}
    assert seen["net"] != "connected"


@needs_sandbox
def test_grader_environment_is_not_passed_in(attacked, leaked):
    seen = eval(leaked(attacked["rows"]["peek"], "pairwise_dots"))  # noqa: S307
    assert seen["secret"] == [] and seen["home"] == sandboxing.HOME
    assert seen["count"] <= len(sandboxing.environment("/h", "/t", 1, "/c", "/d")) + 10  # the allow-list, ipykernel's


@needs_sandbox
def test_course_environment_and_exercises_are_read_only(attacked, leaked):
    seen = eval(leaked(attacked["rows"]["aaa_vandal"], "mean_over_time"))  # noqa: S307
    assert seen["startup"] == "written"  # its own private $HOME
    assert {seen[k] for k in ("course_utils", "worker", "pth")} == {"OSError"}  # read-only file system
    # exercises/ is not in the sandbox; a course checked out under /tmp would see the write land in
    # its private /tmp, so what counts is that the real notebook is untouched
    for path, data in attacked["before"].items():
        assert path.read_bytes() == data
    assert not any(Path(p).joinpath("zz_course_attack.pth").exists() for p in sys.path if p)
    victim = attacked["rows"]["zzz_victim"]
    assert victim["total"] == FULL, victim  # nothing planted elsewhere reached it


@needs_sandbox
def test_no_process_outlives_its_submission(attacked, scores):
    assert scores(attacked["rows"]["daemon"])["flatten_tokens"] == 1
    survivors = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if b"course-attack-daemon" in cmdline.read_bytes():
                survivors.append(cmdline.parent.name)
        except OSError:
            pass
    assert not survivors


@needs_sandbox
def test_reference_solutions_are_not_importable_and_attempts_are_flagged(attacked, statuses, leaked):
    row = attacked["rows"]["references"]
    assert statuses(row)["flatten_tokens"].startswith("error: ModuleNotFoundError") and row["total"] == 3
    assert row["flags"] == ["tried to use the exercise references"]  # the grader read it in the answer cell
    sneaky = attacked["rows"]["sneaky"]  # a built name: not flagged, but the references are not there at all
    assert eval(leaked(sneaky, "mean_over_time")) == ["ImportError", "FileNotFoundError"]  # noqa: S307
    assert attacked["rows"]["zzz_victim"]["flags"] == []


@needs_sandbox
def test_forged_results_are_refused_without_cost(attacked, scores, statuses):
    st = statuses(attacked["rows"]["forger"])
    assert st == {"flatten_tokens": "error: not a safetensors file (refused)",
                  "mean_over_time": "error: malformed results",
                  "pairwise_dots": "error: results with too many tensor elements (more than 4194304)"}
    assert not UNPICKLED.exists()  # the pickle was refused unread
    fifo = attacked["rows"]["fifo"]
    assert scores(fifo) == {"flatten_tokens": 0, "mean_over_time": 1, "pairwise_dots": 2}


@needs_sandbox
def test_huge_display_message_does_not_sink_the_worker(attacked):
    assert attacked["rows"]["flood"]["total"] == 4


@needs_sandbox
def test_process_and_memory_caps_hold_for_the_submission_as_a_whole(attacked, statuses, leaked):
    spawned = eval(leaked(attacked["rows"]["forks"], "flatten_tokens"))["spawned"]  # noqa: S307
    assert 0 < spawned < 64
    hog = attacked["rows"]["hog"]
    st = statuses(hog)["mean_over_time"]
    held = eval(st.split("seen ", 1)[1])["held"] if "seen " in st else 0  # noqa: S307
    assert held <= 2, st  # 3 x 700 MB never fit under 2048 MB with the kernel running


@pytest.mark.parametrize("name, status", [
    ("deep", "not JSON (RecursionError)"), ("bigint", "not JSON (ValueError)"),
    ("many_cells", "too many cells (3000"), ("huge", "file too large"), ("pipe", "not a regular file"),
    ("link", "unreadable file"),
])
@needs_sandbox
def test_odd_files_get_a_row_with_a_status(attacked, name, status):
    row = attacked["rows"][name]
    assert row["status"].startswith(status) and row["total"] == 0, row["status"]


@pytest.mark.parametrize("name, total", [
    ("course_string", 4), ("lesson_list", 4), ("grade_id_list", 3), ("nbgrader_string", 3),
])
@needs_sandbox
def test_metadata_of_the_wrong_type_costs_only_that_cell(attacked, name, total):
    row = attacked["rows"][name]
    assert row["lesson"] == "00_setup" and row["total"] == total, row


@needs_sandbox
def test_gradebook_and_feedback_are_safe_to_open(attacked, statuses):
    out = attacked["out"]
    text = (out / "gradebook.csv").read_text() + (out / "results.json").read_text()
    text += "".join(p.read_text() for p in (out / "feedback").iterdir())
    assert "\x1b" not in text and "\x07" not in text
    with open(out / "gradebook.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert len(rows) == 1 + len(ATTACKS) + len(ODD_FILES) + 2
    cells = [cell for row in rows for cell in row]
    assert not any(cell.startswith(("=", "+", "-", "@")) for cell in cells)
    assert "'=HYPERLINK(1)+2" in cells
    ansi = attacked["rows"]["=HYPERLINK(1)+2"]
    assert statuses(ansi)["mean_over_time"] == "error: ValueError: red done"


@needs_sandbox
def test_printed_table_has_no_escape_codes(attacked):
    assert "\x1b" not in attacked["printed"] and "ValueError: red done" in attacked["printed"]


@needs_sandbox
def test_signal_ignoring_and_stopping_answers_cannot_stretch_the_clock(attacked, statuses):
    from course_tools.grading.grade import WALL_GRACE

    for name in ("deaf", "freezer"):
        row = attacked["rows"][name]
        assert row["status"] == "notebook timeout" and statuses(row)["flatten_tokens"] == "timeout", row
        assert row["seconds"] < NOTEBOOK_LIMIT + WALL_GRACE + 15


# --- a grader that is killed, and grading without bubblewrap ---

@needs_sandbox
def test_killing_the_grader_keeps_finished_rows_and_leaves_no_process(tmp_path):
    folder = tmp_path / "subs"
    folder.mkdir()
    nbformat.write(SOLUTION, folder / "a_full.ipynb")
    orphan = answers(flatten_tokens=DEAF.replace("pass", "pass  # course-attack-orphan"))
    nbformat.write(orphan, folder / "b_deaf.ipynb")
    book = tmp_path / "gradebook.csv"
    grader = subprocess.Popen([sys.executable, "-m", "course_tools.cli", "grade", str(folder), "--gradebook", str(book),
                               "--notebook-timeout", "300"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not (book.exists() and len(book.read_text().splitlines()) == 2):
        time.sleep(0.5)
    time.sleep(3)  # let the second submission's kernel start looping
    grader.send_signal(signal.SIGKILL)
    grader.wait()
    rows = list(csv.DictReader(book.open()))
    assert [(r["student"], r["total"]) for r in rows] == [("a_full", str(FULL))]
    time.sleep(2)
    left = [p for p in Path("/proc").glob("[0-9]*/cmdline") if _reads(p, b"course-attack-orphan")]
    assert not left


def _reads(path, needle):
    try:
        return needle in path.read_bytes()
    except OSError:
        return False


def test_grading_refuses_without_a_sandbox_unless_told(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sandboxing.shutil, "which", lambda name: None)
    nbformat.write(SOLUTION, tmp_path / "s.ipynb")
    assert main(["grade", str(tmp_path / "s.ipynb")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bubblewrap" in err and "--no-sandbox" in err


def test_no_sandbox_grades_with_a_warning_in_output_and_gradebook(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sandboxing.shutil, "which", lambda name: None)
    nbformat.write(SOLUTION, tmp_path / "s.ipynb")
    book = tmp_path / "book.csv"
    assert main(["grade", str(tmp_path / "s.ipynb"), "--no-sandbox", "--gradebook", str(book)]) == 0
    assert capsys.readouterr().out.startswith("WARNING: NO SANDBOX")
    row = next(csv.DictReader(book.open()))
    assert row["total"] == str(FULL) and row["sandbox"].startswith("NO SANDBOX")


class _Payload:
    """Unpickled, this makes the file named by its argument."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_pickles_and_zips_where_the_results_go_are_refused_unread(tmp_path, monkeypatch):
    """A pickle (with a payload), a ``torch.save`` file and a zip that inflates to 8 MB are not safetensors
    files: each is refused by its first 8 bytes, and no unpickler or tensor reader is called."""
    import pickle

    import torch

    from course_tools.grading import results

    def unread(*args, **kwargs):
        raise AssertionError("read a file that the checks refuse")

    monkeypatch.setattr(pickle, "loads", unread)
    monkeypatch.setattr(torch, "load", unread)
    monkeypatch.setattr(results.safetensors.torch, "load", unread)
    marker = tmp_path / "unpickled"
    saved, bomb = io.BytesIO(), io.BytesIO()
    torch.save({"kind": "cases", "results": [{"status": "ok", "value": torch.ones(3)}]}, saved)
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("archive/data.pkl", b"\0" * (8 << 20))
    files = {"pickle": pickle.dumps({"kind": "cases", "results": [_Payload(marker)]}), "torch_save": saved.getvalue(),
             "zip": bomb.getvalue(), "text": b"not a file of ours at all"}
    checked = results.check_outputs({name: data for name, data in files.items()})
    assert {name: str(exc) for name, exc in checked.items()} == dict.fromkeys(files, "not a safetensors file (refused)")
    assert not marker.exists()


def test_hints_run_only_on_answers_of_bounded_size():
    import torch

    from course_tools.exercises import checks
    from course_tools.grading import grade

    calls = []
    ex = checks.Exercise("x", reference=lambda x: x, cases=None,
                         hints=[lambda case, got, expected: calls.append(got.numel()) or "look again"])
    case = checks.Case("c", (torch.ones(4),))
    big = grade.judge_case(ex, case, {"status": "ok", "value": torch.zeros(2**20)})
    small = grade.judge_case(ex, case, {"status": "ok", "value": torch.zeros(5)})
    assert calls == [5] and "hint" not in big.line and "hint: look again" in small.line


def test_a_run_report_is_cut_to_what_the_grader_reads_and_round_trips():
    """1,500 errors of 600 characters (under the 1 MiB read limit) come back as 1,000 of 500."""
    from course_tools.grading.job import ERROR_CHARS, REPORT_BYTES, REPORTED_ERRORS, RunReport

    raw = json.dumps({"status": "finished", "errors": {str(i): "x" * 600 for i in range(1500)}}).encode()
    assert len(raw) < REPORT_BYTES
    report = RunReport.read(raw)
    assert report.status == "finished" and len(report.errors) == REPORTED_ERRORS == 1000
    assert {len(text) for text in report.errors.values()} == {ERROR_CHARS} == {500}
    sent = RunReport("timeout", {"3": "ValueError: no"})
    assert RunReport.read(sent.to_json()) == sent


@pytest.mark.parametrize("raw", [None, b"\0garbage{", b"[]", b'{"status": "finished", "errors": []}',
                                 b'{"status": ["finished"]}', b"[" * 100_000])
def test_a_garbled_run_report_means_a_crashed_notebook(raw):
    from course_tools.grading.job import RunReport

    report = RunReport.read(raw)
    assert report.status in ("crashed", "finished") and isinstance(report.errors, dict)
    assert report.status == "crashed" or raw == b'{"status": "finished", "errors": []}'
