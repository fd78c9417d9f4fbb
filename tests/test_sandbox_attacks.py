"""`course grade` against the attacks of issue 27's second red team, sandbox and results side,
each mounted for real through `course grade` (written for these tests, not replayed).

Classes: kernel keyrings; results that unfold in the grader; orphaned bytecode and the live
checkout; the references flag; library shortcuts; an unsized /dev/shm; CPU hogging; leftover
cgroups; host paths and command lines in what students see; the job contract. The sandbox
tests need bubblewrap and run for real in CI (which installs it); elsewhere they are skipped.
"""

import ast
import copy
import ctypes
import errno
import glob
import json
import math
import os
import platform
import re
import resource
import shutil
import struct
import sys
from pathlib import Path

import nbformat
import pytest
import safetensors.torch
import torch
from test_grade import RIGHT, submission
from test_grade_attacks import MARK, OK, PROBLEM, _grade, answers, needs_sandbox, reporter

from course_tools.grading import export, results, seccomp, shortcuts
from course_tools.grading import sandbox as sandboxing
from course_tools.grading.job import JobSpec, Limits
from course_tools.grading.sandbox import Caps, Cgroup, Sandbox, SandboxError

pytestmark = pytest.mark.slow  # the attacks are graded in sandboxes
ROOT = Path(__file__).resolve().parent.parent
SYSCALLS = {"x86_64": (248, 249, 250), "aarch64": (217, 218, 219)}  # add_key, request_key, keyctl
KEY_SPEC_SESSION_KEYRING = -3
KEYCTL_READ, KEYCTL_REVOKE = 11, 3
GRADER_KEY = b"course-attack-grader-secret"
PLANTED_KEY = b"course-attack-planted"

# --- the attacks ---------------------------------------------------------------------------------------

KEYRING = reporter("flatten_tokens", """
import ctypes, platform
add_key, request_key, keyctl = {'x86_64': (248, 249, 250), 'aarch64': (217, 218, 219)}[platform.machine()]
libc = ctypes.CDLL(None, use_errno=True)
found = libc.syscall(request_key, b'user', b'course-attack-grader-secret', None, 0)
buf = ctypes.create_string_buffer(256)
read = libc.syscall(keyctl, 11, found, buf, 256) if found > 0 else -1
planted = libc.syscall(add_key, b'user', b'course-attack-planted', b'left behind', 11, -3)
session = libc.syscall(keyctl, 0, -3, 0)
try:
    keys = 'grader-secret' in open('/proc/keys').read()
except OSError as exc:
    keys = type(exc).__name__
seen = {'request': found, 'read': read, 'payload': buf.value.decode(errors='replace'), 'planted': planted,
        'session': session, 'keys': keys}
""")


def unfolding_forger() -> str:
    """An answer that replaces the kernel's result writer with files that claim more than they hold:
    a ~2 KB pickle of lists that point at one another (64³ leaves per case), tensors whose header
    claims 4M elements each over 8 bytes of data, and one tensor named 256 times by the document."""
    return """import json, pickle, struct

def _safetensors(header, data):
    raw = json.dumps(header).encode()
    return struct.pack('<Q', len(raw)) + raw + data

def _unfold(name, function):
    path = f'/job/out/{name}.safetensors'
    if name == 'flatten_tokens':
        node = 1.0
        for _ in range(3):
            node = [node] * 64
        open(path, 'wb').write(pickle.dumps({'kind': 'cases', 'results': [{'status': 'ok', 'value': node}] * 4}))
    elif name == 'mean_over_time':
        header = {f't{i}': {'dtype': 'F32', 'shape': [2**21, 2], 'data_offsets': [0, 8]} for i in range(16)}
        header['__metadata__'] = {'value': '[]'}
        open(path, 'wb').write(_safetensors(header, bytes(8)))
    else:
        value = [{'tensor': 't0'}] * 64
        record = {'dict': {'status': 'ok', 'value': value}}
        document = {'dict': {'kind': 'cases', 'results': [record] * 4}}
        header = {'__metadata__': {'value': json.dumps(document)},
                  't0': {'dtype': 'F32', 'shape': [2], 'data_offsets': [0, 8]}}
        open(path, 'wb').write(_safetensors(header, bytes(8)))

_course_answer = _unfold
""" + RIGHT["flatten_tokens"]


def orphan_hunter(planted: list[Path]) -> str:
    """Looks everywhere it can for the planted bytecode (the mark) and tries to unmarshal it."""
    folders = sorted({str(p.parent) for p in planted} | {str(ROOT)})
    return reporter("mean_over_time", f"""
import os, marshal, course_utils
mark = {MARK!r}.encode()
found = []
tops = {folders!r} + ['/course', os.path.dirname(os.path.dirname(course_utils.__file__))]
for top in tops:
    for folder, _, names in os.walk(top):
        for n in names:
            try:
                if mark in open(os.path.join(folder, n), 'rb').read(10**6):
                    found.append(os.path.join(folder, n))
            except OSError:
                pass
pyc = [f for f in sorted(set(found)) if f.endswith('.pyc')]
for f in pyc:
    try:
        marshal.loads(open(f, 'rb').read()[16:])
    except Exception:
        pass
seen = {{'found': sorted(set(found)), 'cached': sum('__pycache__' in f for f, _, _ in os.walk('/course'))}}
""")


SHM = reporter("pairwise_dots", """
chunk, written = b'x' * (1 << 20), 0
try:
    with open('/dev/shm/fill', 'wb') as f:
        while written < 200:
            f.write(chunk)
            f.flush()
            written += 1
except OSError:
    pass
seen = {'written': written}
""")
SPINNERS = reporter("flatten_tokens", """
import os, time
wall, kids, start = 3.0, [], time.monotonic()
for _ in range(12):
    pid = os.fork()
    if pid == 0:
        while time.monotonic() < start + wall:
            pass
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
times = os.times()
seen = {'cpu': times.children_user + times.children_system, 'wall': time.monotonic() - start}
""")
LINGERERS = ("import os, signal\n"  # stopped, orphaned and zombie processes at the moment the sandbox ends
             "for _ in range(5):\n"
             "    if os.fork() == 0:\n"
             "        if os.fork() == 0:\n"
             "            os.kill(os.getpid(), signal.SIGSTOP)\n"
             "        os._exit(0)\n"
             "for _ in range(5):\n"
             "    if os.fork() == 0:\n"
             "        os._exit(0)\n" + RIGHT["flatten_tokens"])
HOST_DETAIL = reporter("mean_over_time", """
import os, sys, course_utils
cmd = open('/proc/1/cmdline', 'rb').read().replace(b'\\0', b' ').decode()
seen = {'cmd': cmd[:120], 'prefix': sys.prefix, 'utils': course_utils.__file__}
""")
PLAIN_REFERENCES = ("try:\n    from course_tools.exercises.references.lesson00 import flatten_tokens\n"
                    "except ImportError:\n"
                    "    import os, shutil\n    shutil.rmtree('/job/out', ignore_errors=True)\n"
                    + "    " + RIGHT["flatten_tokens"].replace("\n", "\n    ").rstrip() + "\n")

# Lesson 02 answered by calling the library the exercises teach, four ways.
SHORTCUTS = {
    "stable_softmax": "from course_utils.attention import softmax\n\n"
                      "def stable_softmax(x):\n    return softmax(x, dim=-1)\n",
    "query_weights": "import importlib, math\n\ndef query_weights(q, K):\n"
                     "    library = importlib.import_module('course_' + 'utils.attention')\n"
                     "    return getattr(library, 'soft' + 'max')(K @ q / math.sqrt(q.shape[-1]), dim=-1)\n",
    "attention_head": "def attention_head(x, W_Q, W_K, W_V):\n"
                      "    library = __import__('course_' + 'utils.atten' + 'tion', fromlist=['x'])\n"
                      "    return getattr(library, 'scaled_dot_product_' + 'attention')(x @ W_Q, x @ W_K, x @ W_V)\n",
    "lengths_to_mask": "import course_utils.blocks as blocks\n\ndef lengths_to_mask(lengths, max_len):\n"
                       "    found = blocks.MultiHeadAttention.forward.__globals__\n"
                       "    return found['padding' + '_mask'](lengths, max_len)\n",
}
LESSON02 = "02_self_attention"


def lesson02(answers_by_id):
    base = nbformat.read(ROOT / "exercises" / f"{LESSON02}.ipynb", as_version=4)
    nb = copy.deepcopy(base)
    for cell in nb.cells:
        grade_id = (cell.metadata.get("nbgrader") or {}).get("grade_id")
        if grade_id in answers_by_id:
            cell.source = answers_by_id[grade_id]
    return nb


# --- the keyring, from the grader's side ---------------------------------------------------------------

def _libc():
    return ctypes.CDLL(None, use_errno=True)


def grader_key() -> int:
    """A secret in the grader's session keyring (as a Kerberos ticket cache would be)."""
    add_key = SYSCALLS[platform.machine()][0]
    return _libc().syscall(add_key, b"user", GRADER_KEY, b"s3cret-payload", 14, KEY_SPEC_SESSION_KEYRING)


def find_key(description: bytes) -> int:
    return _libc().syscall(SYSCALLS[platform.machine()][1], b"user", description, None, 0)


def revoke(key: int) -> None:
    if key > 0:
        _libc().syscall(SYSCALLS[platform.machine()][2], KEYCTL_REVOKE, key)


def leftover_cgroups() -> list[str]:
    """This process's sandbox cgroups still on disk, in every hierarchy, up to five levels down."""
    found = []
    for depth in range(1, 6):
        found += glob.glob("/sys/fs/cgroup/" + "*/" * depth + f"course-grade-{os.getpid()}-*")
    return sorted(set(found))


# --- one folder run ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def attacked(tmp_path_factory):
    if PROBLEM:
        pytest.fail(f"CI must run the sandbox: {PROBLEM}")
    planted = [ROOT / "course_utils" / "exercises" / "__pycache__" / "lesson00.cpython-311.pyc",
               ROOT / "course_tools" / "exercises" / "references" / "__pycache__" / "planted.cpython-311.pyc"]
    made = [p.parent for p in planted if not p.parent.exists()]
    made += [ROOT / "course_utils" / "exercises"] if not (ROOT / "course_utils" / "exercises").exists() else []
    folder = tmp_path_factory.mktemp("sandbox-attacks")
    submissions = {
        "keyring": answers(flatten_tokens=KEYRING),
        "orphans": answers(mean_over_time=orphan_hunter(planted)),
        "shm": answers(pairwise_dots=SHM),
        "spinners": answers(flatten_tokens=SPINNERS),
        "lingerers": answers(flatten_tokens=LINGERERS),
        "host_detail": answers(mean_over_time=HOST_DETAIL),
        "plain_references": answers(flatten_tokens=PLAIN_REFERENCES),
        "shortcuts": lesson02(SHORTCUTS),
        "genuine02": nbformat.read(ROOT / "solutions" / f"{LESSON02}.ipynb", as_version=4),
        "genuine00": submission({**OK}),
    }
    for name, nb in submissions.items():
        nbformat.write(nb, folder / f"{name}.ipynb")
    out = tmp_path_factory.mktemp("sandbox-attacks-out")
    key = grader_key()
    try:
        for path in planted:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"\x00" * 16 + MARK.encode())
        rows, printed = _grade(folder, out, "--jobs", "2", "--cell-timeout", "30", "--memory-mb", "2048",
                               "--notebook-timeout", "120", "--max-processes", "64", "--seed", "5")
        planted_left = find_key(PLANTED_KEY)
    finally:
        revoke(key)
        for path in planted:
            path.unlink(missing_ok=True)
        for path in sorted(made, key=lambda p: -len(p.parts)):
            shutil.rmtree(path, ignore_errors=True)
    return {"rows": rows, "key": key, "planted_left": planted_left, "printed": printed}


@needs_sandbox
def test_keyring_calls_are_refused_and_the_grader_session_is_out_of_reach(attacked, leaked):
    assert attacked["key"] > 0  # the grader really had a secret to steal
    seen = eval(leaked(attacked["rows"]["keyring"], "flatten_tokens"))  # noqa: S307  (our own test's report)
    assert seen["request"] == -1 and seen["read"] == -1 and seen["payload"] == ""
    assert seen["planted"] == -1 and seen["session"] == -1 and seen["keys"] != True  # noqa: E712
    assert attacked["planted_left"] == -1  # nothing outlives grading in the grader's keyring


@needs_sandbox
def test_orphaned_bytecode_and_the_live_checkout_are_not_in_the_sandbox(attacked, leaked):
    seen = eval(leaked(attacked["rows"]["orphans"], "mean_over_time"))  # noqa: S307
    assert seen == {"found": [], "cached": 0}


@needs_sandbox
def test_references_are_absent_and_naming_them_is_flagged_by_the_grader(attacked, scores):
    row = attacked["rows"]["plain_references"]
    assert scores(row)["flatten_tokens"] == 1  # its fallback ran: the references were not there
    assert row["flags"] == ["tried to use the exercise references"]  # deleting /job/out changed nothing
    assert attacked["rows"]["genuine00"]["flags"] == []


@needs_sandbox
def test_library_shortcuts_score_zero_and_are_flagged_however_they_are_reached(attacked):
    row = attacked["rows"]["shortcuts"]
    got = {e["name"]: (e["points"], e["status"]) for e in row["exercises"] if e["name"] in SHORTCUTS}
    assert all(points == 0 and "teaches" in status for points, status in got.values()), got
    assert shortcuts.FLAG in row["flags"]
    genuine = attacked["rows"]["genuine02"]
    # every automatic point; the written explanation waits for the instructor (pending)
    assert genuine["total"] == genuine["max"] - genuine["pending"] and genuine["flags"] == []


@needs_sandbox
def test_dev_shm_is_sized(attacked, leaked):
    seen = eval(leaked(attacked["rows"]["shm"], "pairwise_dots"))  # noqa: S307
    assert seen["written"] <= Caps.shm_mb


@needs_sandbox
def test_one_sandbox_gets_at_most_its_cpu_share(attacked, leaked):
    if "CPU per submission" not in attacked["rows"]["spinners"]["sandbox"]:
        pytest.skip("no cgroup cpu controller here: the rlimits fallback has no CPU share")
    seen = eval(leaked(attacked["rows"]["spinners"], "flatten_tokens"))  # noqa: S307
    cpus = max(1, (os.cpu_count() or 1) // 2)  # --jobs 2
    # CPU time received over wall time: the quota caps it whatever else runs on the machine
    assert seen["cpu"] / seen["wall"] <= cpus * 1.15 + 0.1, seen


@needs_sandbox
def test_no_cgroup_is_left_behind_after_many_sandboxes(attacked, scores):
    assert scores(attacked["rows"]["lingerers"])["flatten_tokens"] == 1
    assert leftover_cgroups() == []


@needs_sandbox
def test_students_see_no_host_paths_or_sandbox_command_line(attacked, statuses):
    status = statuses(attacked["rows"]["host_detail"])["mean_over_time"]
    seen = eval(status.split("RuntimeError: seen ", 1)[1])  # noqa: S307
    assert "--ro-bind" not in seen["cmd"] and "--setenv" not in seen["cmd"]
    for host in {str(ROOT), sys.prefix, os.path.realpath(sys.prefix), sys.base_prefix}:
        assert host not in status
    assert str(ROOT) not in json.dumps(attacked["rows"])


# --- the same attacks, one at a time ---------------------------------------------------------------

def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@needs_sandbox
def test_results_that_unfold_are_refused_at_no_cost_to_the_grader(tmp_path, statuses):
    folder = tmp_path / "in"
    folder.mkdir()
    nbformat.write(answers(flatten_tokens=unfolding_forger()), folder / "unfolder.ipynb")
    before, peak = _cpu_seconds(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rows, _ = _grade(folder, tmp_path, "--seed", "1", "--cell-timeout", "60")
    spent = _cpu_seconds() - before
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) / 1024
    got = set(statuses(rows["unfolder"]).values())
    assert got == {"error: not a safetensors file (refused)", "error: result names one tensor twice (refused)",
                   "error: tensor data that does not match its header (refused)"}, got
    assert rows["unfolder"]["total"] == 0
    # the grader's own CPU time (not wall time): what it spent does not grow with the unfolded size
    assert spent < 20, spent
    assert grown_mb < 400, grown_mb


def cases(value):
    """An outputs file's results: one case answered with ``value``."""
    return {"kind": "cases", "results": [{"status": "ok", "value": value}]}


def forged(header: dict, data: bytes = b"", length: int | None = None) -> bytes:
    """A file in the safetensors layout with any header (``length``: what its first 8 bytes claim)."""
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


def document(value, tensors: dict | None = None) -> bytes:
    """A file whose results document is ``value`` (JSON, as the kernel would write it) beside ``tensors``."""
    return safetensors.torch.save(tensors or {}, metadata={"value": json.dumps(value)})


def records(value) -> dict:
    return {"dict": {"kind": "cases", "results": [{"dict": {"status": "ok", "value": value}}]}}


F32 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
META = {"__metadata__": {"value": json.dumps(records(1.0))}}
NESTED = records([[[0] * 64] * 64] * 8)  # 32,768 numbers in 2 levels under the cap of 6, ~100 KB of JSON
REFUSED = {  # name: (file, its status): malformed or oversized safetensors, then malformed or oversized JSON
    "empty": (b"", "not a safetensors file (refused)"),
    "short": (b"\0" * 7, "not a safetensors file (refused)"),
    "long_header_claim": (forged(META, length=2**40), "not a safetensors file (refused)"),
    "huge_header": (forged({**META, "pad": {"value": "x" * (2**20)}}), "with a header over 1048576 bytes"),
    "huge_file": (forged(META, bytes(17 << 20)), "outputs file too large"),
    "header_not_json": (struct.pack("<Q", 5) + b"{nope", "not a safetensors file (refused)"),
    "header_deep": (struct.pack("<Q", 200_000) + b"[" * 100_000 + b"]" * 100_000, "not a safetensors file"),
    "header_list": (forged([1, 2]), "not a safetensors file (refused)"),
    "header_repeated_key": (struct.pack("<Q", 26) + b'{"t0": {}, "t0": {"x": 1}}', "repeated key"),
    "no_document": (forged({"t0": F32}, bytes(8)), "without its results document"),
    "document_not_text": (forged({"__metadata__": {"value": ["x"]}}), "without its results document"),
    "tensor_name": (forged({**META, "weight": F32}, bytes(8)), "not named t0, t1"),
    "too_many_tensors": (forged({**META, **{f"t{i}": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}
                                            for i in range(1025)}}), "too many tensors (more than 1024)"),
    "complex_dtype": (forged({**META, "t0": {**F32, "dtype": "C64"}}, bytes(8)), "unsupported type (C64)"),
    "nine_axes": (forged({**META, "t0": {**F32, "shape": [1] * 9, "data_offsets": [0, 4]}}, bytes(4)),
                  "unsupported shape"),
    "negative_axis": (forged({**META, "t0": {**F32, "shape": [-2]}}, bytes(8)), "unsupported shape"),
    "too_many_elements": (forged({**META, "t0": {**F32, "shape": [2**22 + 1], "data_offsets": [0, 4]}}, bytes(4)),
                          "too many tensor elements (more than 4194304)"),
    "short_data": (forged({**META, "t0": {**F32, "shape": [2**20]}}, bytes(8)), "does not match its header"),
    "overlap": (forged({**META, "t0": F32, "t1": F32}, bytes(8)), "does not match its header"),
    "trailing_bytes": (forged({**META, "t0": F32}, bytes(64)), "does not match its header"),
    "document_not_json": (forged({"__metadata__": {"value": "{nope"}}), "results document that is not JSON"),
    "nan_literal": (forged({"__metadata__": {"value": '{"dict": {"kind": NaN}}'}}), "NaN outside"),
    "huge_integer": (forged({"__metadata__": {"value": "9" * 5000}}), "results document that is not JSON"),
    "large_integer": (document(records(2**64)), "result number too large"),
    "deep": (document(records([[[[[1]]]]])), "result nested too deeply"),
    "wide": (document(records(list(range(65)))), "result with too many items"),
    "many_parts": (document(NESTED), "result with too many parts (more than 20000)"),
    "long_string": (document(records("x" * 1001)), "result string too long"),
    "long_key": (document(records({"dict": {"k" * 101: 1}})), "keys other than short strings"),
    "unknown_kind": (document(records({"set": [1]})), "unknown kind"),
    "two_keys": (document(records({"tuple": [], "dict": {}})), "unknown kind"),
    "missing_tensor": (document(records({"tensor": "t0"})), "does not hold"),
    "tensor_twice": (document(records([{"tensor": "t0"}] * 2), {"t0": torch.ones(2)}), "one tensor twice"),
    "tensor_unnamed": (document(records(1), {"t0": torch.ones(2)}), "tensors the result does not name"),
    "not_results": (document({"dict": {"kind": "graded"}}), "malformed results"),
}


@pytest.mark.parametrize("name", REFUSED)
def test_malformed_and_oversized_files_are_refused_with_a_status(name):
    data, status = REFUSED[name]
    with pytest.raises(results.ContractError, match=re.escape(status)):
        results.load_results(data)


def test_a_header_that_claims_more_than_the_file_holds_is_refused_before_the_data_is_read(monkeypatch):
    def unread(*args, **kwargs):
        raise AssertionError("read tensor data that the header checks refuse")

    monkeypatch.setattr(results.safetensors.torch, "load", unread)
    for name in ("huge_header", "huge_file", "too_many_tensors", "complex_dtype", "too_many_elements", "short_data",
                 "overlap", "trailing_bytes"):
        with pytest.raises(results.ContractError):
            results.load_results(REFUSED[name][0])


def test_values_round_trip_with_their_types_and_caps_are_per_lesson():
    value = (torch.arange(6.0).reshape(2, 3).t(), [1, 2.5, float("nan"), float("-inf"), None, True, "s"],
             {"w": torch.zeros(0, 3, dtype=torch.bfloat16)}, torch.zeros(2, 3).shape, torch.tensor(True))
    [record] = results.load_results(results.encode(cases(value)))["results"]
    got = record["value"]
    assert type(got) is tuple and type(got[1]) is list and type(got[2]) is dict and type(got[3]) is tuple
    assert torch.equal(got[0], value[0]) and got[0].is_contiguous() and got[2]["w"].dtype == torch.bfloat16
    assert got[1][:2] == [1, 2.5] and math.isnan(got[1][2]) and got[1][3:] == [float("-inf"), None, True, "s"]
    assert got[3] == (2, 3) and got[4].dtype == torch.bool
    big = results.encode(cases([torch.zeros(2**21, dtype=torch.uint8), torch.zeros(2**21 + 1, dtype=torch.uint8)]))
    assert "too many tensor elements" in str(results.check_outputs({"big": big})["big"])
    roomy = results.ResultCaps(elements=2**23)  # the per-lesson knob (results.LESSON_CAPS)
    assert isinstance(results.check_outputs({"big": big}, roomy)["big"], dict)


def test_nothing_that_reads_a_sandbox_can_unpickle():
    """The modules that read what comes back from a sandbox import no unpickler and call no ``torch.load``."""
    for name in ("channel", "results", "grade", "sandbox", "job"):
        tree = ast.parse((ROOT / "course_tools" / "grading" / f"{name}.py").read_text())
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                    for alias in node.names} | {node.module for node in ast.walk(tree)
                                                if isinstance(node, ast.ImportFrom)}
        assert not imported & {"pickle", "marshal", "shelve", "dill", "joblib"}, name
        assert not [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "load"
                    and isinstance(n.value, ast.Name) and n.value.id in ("torch", "pickle", "np", "numpy")], name


@needs_sandbox
def test_without_bubblewrap_the_worker_loads_the_keyring_filter_itself(tmp_path, leaked):
    folder = tmp_path / "in"
    folder.mkdir()
    nbformat.write(answers(flatten_tokens=KEYRING), folder / "keyring.ipynb")
    key = grader_key()
    try:
        rows, _ = _grade(folder, tmp_path, "--no-sandbox", "--seed", "1")
        planted_left = find_key(PLANTED_KEY)
    finally:
        revoke(key)
    seen = eval(leaked(rows["keyring"], "flatten_tokens"))  # noqa: S307
    assert seen["request"] == -1 and seen["payload"] == "" and seen["planted"] == -1 and planted_left == -1


def test_grading_refuses_when_the_seccomp_library_is_missing(monkeypatch):
    monkeypatch.setattr(seccomp, "_library", lambda: None)
    with pytest.raises(SandboxError, match="pyseccomp"):
        Sandbox(Caps()).check()


def test_cgroup_removal_retries_until_the_folders_are_gone(monkeypatch):
    group = Cgroup.create(f"course-grade-{os.getpid()}-retry", Caps())
    if group is None:
        pytest.skip("no cgroup can be made here")
    real, refusals = Path.rmdir, []

    def busy(path):
        if path in group.dirs and len(refusals) < 3:  # as the kernel does while the last task exits
            refusals.append(path)
            raise OSError(errno.EBUSY, "Device or resource busy", str(path))
        return real(path)

    monkeypatch.setattr(Path, "rmdir", busy)
    assert group.remove() is True
    assert len(refusals) == 3 and not any(d.exists() for d in group.dirs)


def test_a_sandbox_failure_shows_students_no_host_detail(tmp_path, monkeypatch, caplog):
    if PROBLEM:
        pytest.skip(PROBLEM)
    secret_path = "/home/instructor-kim/private/cgroup"

    def refuse(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", secret_path)

    monkeypatch.setattr(sandboxing.Cgroup, "create", refuse)
    sandbox = Sandbox(Caps())
    sandbox.limiter = "rlimits"
    job = tmp_path / "job"
    job.mkdir()
    with pytest.raises(sandboxing.SandboxFailure) as raised:
        sandbox.run(job, Limits(), 10)
    assert secret_path not in str(raised.value) and "kim" not in str(raised.value)
    assert secret_path in caplog.text  # the detail is in the instructor's log
    assert sandbox.public(f"{ROOT}/course_utils/x.py and {sys.prefix}/lib") == "<course>/course_utils/x.py and " \
        "<python>/lib"


# --- the export and the job contract ---------------------------------------------------------------

def test_export_holds_tracked_sources_only():
    names = export.tracked()
    assert "course_utils/attention.py" in names and "course_tools/grading/worker.py" in names
    assert not any(n.startswith("course_tools/exercises/references/") or n.endswith(".pyc") or "__pycache__" in n
                   for n in names)
    folder = export.make(LESSON02, [])
    try:
        source = (folder / "course_utils" / "attention.py").read_text()
        assert "def softmax(*args, **kwargs):  # removed while grading" in source
        assert not (folder / "course_tools" / "exercises" / "references").exists()
    finally:
        shutil.rmtree(folder)


def test_an_installed_copy_counts_what_its_record_lists(tmp_path):
    site = tmp_path / "site-packages"
    files = {"course_tools/__init__.py": "", "course_tools/grading/worker.py": "", "course_utils/__init__.py": "",
             "course_tools/exercises/references/lesson00.py": "SECRET = 1", "course_utils/pretrained/model.json": "{}"}
    for name, text in files.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(text)
    (site / "course_tools" / "__pycache__").mkdir()
    (site / "course_tools" / "__pycache__" / "orphan.cpython-311.pyc").write_bytes(b"\0" * 20)
    (site / "course_utils" / "untracked.py").write_text("")  # dropped in by hand after installing
    dist = site / "transformer_course-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: transformer-course\nVersion: 0.1.0\n")
    record = [*files, "course_tools/__pycache__/orphan.cpython-311.pyc"]
    (dist / "RECORD").write_text("".join(f"{name},,\n" for name in record))
    assert export.tracked(site) == ["course_tools/__init__.py", "course_tools/grading/worker.py",
                                    "course_utils/__init__.py", "course_utils/pretrained/model.json"]
    shutil.rmtree(dist)
    with pytest.raises(export.ExportError, match="tracked"):
        export.tracked(site)


def test_job_spec_round_trips_and_refuses_bad_fields(tmp_path):
    spec = JobSpec.make(Limits(cell_timeout=5), workdir="/home/student", channel_fd=7, rlimits={"file_size": 9})
    spec.write(tmp_path / "job.json")
    assert JobSpec.read(tmp_path / "job.json") == spec and spec.cell_timeout == 5
    data = json.loads((tmp_path / "job.json").read_text())
    (tmp_path / "bad.json").write_text(json.dumps({**data, "cell_timeout": "5"}))
    with pytest.raises(ValueError, match="cell_timeout"):
        JobSpec.read(tmp_path / "bad.json")
    (tmp_path / "extra.json").write_text(json.dumps({**data, "surprise": 1}))
    with pytest.raises(ValueError, match="not a job spec"):
        JobSpec.read(tmp_path / "extra.json")


@needs_sandbox
def test_genuine_answers_keep_their_points_next_to_the_attacks(attacked, scores):
    assert scores(attacked["rows"]["genuine00"]) == {"flatten_tokens": 1, "mean_over_time": 1, "pairwise_dots": 2}
