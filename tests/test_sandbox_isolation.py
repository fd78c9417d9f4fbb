"""`course grade` against issue 48's attacks between sandboxes (item 5), mounted for real.

Three kinds: a covert channel through file locks on files every sandbox sees (the system's
Python, ``/dev/null``), from one submission to another graded at the same time; host-global
counters under ``/proc`` (load, CPU and memory totals, uptime, pressure, the boot id) read by a
submission and sent back in its own feedback; and a notebook whose metadata is megabytes of empty
lists, which made the grader's JSON parse build millions of objects. The sandbox tests need
bubblewrap and run for real in CI; elsewhere they are skipped with the reason.
"""

import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import nbformat
import pytest
from test_grade_attacks import _grade, answers, needs_sandbox

from course_tools.grading import submission

pytestmark = pytest.mark.slow  # sandboxes graded side by side, and the attacks on them
ROOT = Path(__file__).resolve().parent.parent
WAIT = 25  # seconds each side of the lock channel waits for the other before giving up

# Each side holds one file locked (flock, POSIX and open-file-description locks in turn) and probes
# the other's: before the fix, the two submissions graded at once saw each other's locks.
LOCK_SIDE = """
import fcntl, glob, os, struct, time
targets = sorted(glob.glob('/usr/lib/python3*/*.py'))[:2] or [os.__file__, glob.__file__]
mine, theirs = (targets[0], targets[1]) if SIDE == 'a' else (targets[1], targets[0])
F_GETLK, F_SETLK, F_OFD_GETLK, F_OFD_SETLK, F_RDLCK, F_WRLCK, F_UNLCK = 5, 6, 36, 37, 0, 1, 2
take = {'flock': lambda fd: fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB),
        'posix': lambda fd: fcntl.fcntl(fd, F_SETLK, struct.pack('hhqqi', F_RDLCK, 0, 0, 0, 0)),
        'ofd': lambda fd: fcntl.fcntl(fd, F_OFD_SETLK, struct.pack('hhqqi', F_RDLCK, 0, 0, 0, 0))}

def held_by_other(kind, fd):
    if kind == 'flock':
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    got = fcntl.fcntl(fd, F_GETLK if kind == 'posix' else F_OFD_GETLK, struct.pack('hhqqi', F_WRLCK, 0, 0, 0, 0))
    return struct.unpack('hhqqi', got)[0] != F_UNLCK

held, refused, seen = [], {}, []
for kind in take:
    fd = os.open(mine, os.O_RDONLY)
    held.append(fd)
    try:
        take[kind](fd)
    except OSError as exc:
        refused[kind] = exc.errno
    probe = os.open(theirs, os.O_RDONLY)
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        try:
            if held_by_other(kind, probe):
                seen.append(kind)
                break
        except OSError:
            break
        time.sleep(0.2)
    os.close(probe)
seen = {'seen': seen, 'refused': refused}
""".replace("WAIT", str(WAIT))


def lock_side(side: str) -> str:
    body = f"SIDE = {side!r}\n" + LOCK_SIDE
    indented = "\n".join("        " + line for line in body.strip().splitlines())
    return (f"_seen = []\n\n\ndef flatten_tokens(*args):\n    if not _seen:\n{indented}\n"
            "        _seen.append(seen)\n    raise RuntimeError('seen ' + str(_seen[0]))\n")


HOST_COUNTERS = """
import os, glob
def read(path):
    try:
        return open(path).read()
    except OSError as exc:
        return type(exc).__name__
import torch, numpy
try:
    load = os.getloadavg()
except OSError as exc:
    load = str(exc)[:12]
seen = {'load': read('/proc/loadavg')[:14], 'up': read('/proc/uptime').split()[0], 'getload': load,
        'stat': [l for l in read('/proc/stat').splitlines() if l.startswith(('btime', 'ctxt'))],
        'mem': [l.split()[1] for l in read('/proc/meminfo').splitlines() if l.startswith('MemTotal')],
        'boot': read('/proc/sys/kernel/random/boot_id')[:13],
        'psi': sorted({read(p).split(' total')[0][-8:] for p in glob.glob('/proc/pressure/*')}),
        'cpus': os.cpu_count(), 'threads': torch.get_num_threads(), 'np': float(numpy.ones(3).sum())}
"""


def host_counters() -> str:
    indented = "\n".join("        " + line for line in HOST_COUNTERS.strip().splitlines())
    return ("_seen = []\n\n\ndef mean_over_time(*args):\n    if not _seen:\n" + indented + "\n"
            "        _seen.append(seen)\n    raise RuntimeError('seen ' + str(_seen[0]))\n")


def amplifier_bytes(megabytes: int = 16) -> bytes:
    """A notebook file (under the 16 MB size limit) whose metadata is millions of empty lists."""
    nb = answers()
    text = nbformat.writes(nb)
    filler = ",".join(["[]"] * ((megabytes * 2**20 - len(text) - 1024) // 3))
    data = json.loads(text)
    data["metadata"]["junk"] = "FILLER"
    return json.dumps(data).replace('"FILLER"', f"[{filler}]").encode()


def test_lock_commands_with_high_bits_set_by_hand_are_refused_too(tmp_path):
    """The kernel reads fcntl's command as 32 bits; the filter must compare only those."""
    probe = f"""
import ctypes, errno, os, struct
from course_tools.grading import seccomp
seccomp.confine_self()
fd = os.open({str(tmp_path / 'f')!r}, os.O_RDWR | os.O_CREAT)
libc = ctypes.CDLL(None, use_errno=True)
lock = ctypes.create_string_buffer(struct.pack('hhqqi', 1, 0, 0, 0, 0))
nr = seccomp._library().resolve_syscall(seccomp._library().Arch.NATIVE, 'fcntl')
got = [libc.syscall(nr, fd, ctypes.c_uint64(cmd), lock) == -1 and ctypes.get_errno() == errno.ENOSYS
       for cmd in (6, 6 | 1 << 32, 37 | 1 << 40)]
print(got, libc.syscall(nr, fd, 1) >= 0)  # F_GETFD, not a lock command, still works
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.stdout.strip() == "[True, True, True] True", done.stdout + done.stderr


@pytest.fixture(scope="module")
def isolated(tmp_path_factory):
    folder = tmp_path_factory.mktemp("isolation")
    for name, nb in {"lock_a": answers(flatten_tokens=lock_side("a")),
                     "lock_b": answers(flatten_tokens=lock_side("b")),
                     "counters": answers(mean_over_time=host_counters()),
                     "genuine": answers()}.items():
        nbformat.write(nb, folder / f"{name}.ipynb")
    (folder / "amplifier.ipynb").write_bytes(amplifier_bytes())
    out = tmp_path_factory.mktemp("isolation-out")
    rows, _ = _grade(folder, out, "--jobs", "2", "--cell-timeout", str(3 * WAIT + 30), "--notebook-timeout", "240",
                     "--seed", "3")
    return rows


@needs_sandbox
def test_two_sandboxes_graded_at_once_cannot_see_each_others_locks(isolated, leaked):
    for side in ("lock_a", "lock_b"):
        seen = eval(leaked(isolated[side], "flatten_tokens"))  # noqa: S307  (our own test's report)
        assert seen["seen"] == [], (side, seen)
        assert set(seen["refused"]) == {"flock", "posix", "ofd"}, (side, seen)


@needs_sandbox
def test_host_global_counters_do_not_reach_a_submission(isolated, leaked):
    seen = eval(leaked(isolated["counters"], "mean_over_time"))  # noqa: S307
    assert seen["boot"] != Path("/proc/sys/kernel/random/boot_id").read_text()[:13]
    assert seen["load"].split()[:3] == ["0.00", "0.00", "0.00"] and seen["up"] == "0.00"
    assert seen["getload"] == "Load average"  # glibc asks sysinfo(), which is refused
    assert seen["stat"] == ["ctxt 0", "btime 0"]
    host_total = [line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                  if line.startswith("MemTotal")]
    assert seen["mem"] != host_total
    assert seen["psi"] in ([], ["300=0.00"]), seen
    # what libraries need from the masked files still works: the processor count, torch, numpy
    assert seen["cpus"] == os.cpu_count() and seen["threads"] >= 1 and seen["np"] == 3.0


def test_metadata_of_millions_of_empty_lists_is_refused_before_it_is_parsed():
    raw = amplifier_bytes()
    tracemalloc.start()
    try:
        with pytest.raises(submission.SubmissionError, match="too many JSON values"):
            submission.parse(raw)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20, peak / 2**20  # the parse would have built ~5 million lists (hundreds of MB)


@needs_sandbox
def test_the_amplified_notebook_gets_a_clear_status_and_genuine_work_keeps_its_points(isolated, scores, statuses):
    row = isolated["amplifier"]
    assert "too many JSON values" in json.dumps(row), row
    assert scores(isolated["genuine"]) == {"flatten_tokens": 1, "mean_over_time": 1, "pairwise_dots": 2}
    assert "error" not in " ".join(statuses(isolated["genuine"]).values())
