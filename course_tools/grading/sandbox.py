"""One sandbox per submission: bubblewrap for what the submission can see, a cgroup for what it
can use, and a hard wall-clock limit enforced from outside.

Inside, the submission sees the system's programs and libraries and the Python installation,
read-only; at ``/course`` a clean export of the course's two packages (tracked sources only, no
references, the lesson's taught functions removed: ``course_tools.grading.export``); its own job
folder read-only; a private, size-limited ``/tmp``, ``$HOME``, ``/dev/shm`` and output folder; no
network; its own PID, IPC and user namespaces (it runs as ``nobody``); a fresh session keyring and
a seccomp filter refusing the keyring calls and file locks (``course_tools.grading.seccomp``: locks
on the files all sandboxes share were a channel between two of them); ``/proc`` files that count
for the whole machine (load, CPU and memory use, uptime, pressure, the boot id) masked by neutral
copies (``proc_masks``), so no submission's feedback carries the host's activity; an allow-listed
environment. bubblewrap reads its options from a pipe, so the sandbox's command line shows no
host paths. Memory, process count and CPU are capped for the sandbox as a whole with a cgroup (v1
or v2, where this process may create one: at most ``Caps.cpus`` processors' worth of CPU time),
else per process with rlimits (then there is no CPU share: each sandbox competes as its
processes). When the time is up or the worker ends, the sandbox's PID namespace is torn down,
which kills every process it started, and its cgroup is removed (retried until it is gone).

Whatever the sandbox reports back to a student is cleaned of the grader's host paths; the full
detail of a sandbox failure goes to the instructor's log (the ``course_tools.grading`` logger).
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass, replace
from pathlib import Path

from course_tools.grading import channel, export, held_out, seccomp
from course_tools.grading.job import JobSpec, Limits, RunReport

ROOT = Path(__file__).resolve().parents[2]
LOG = logging.getLogger("course_tools.grading")
JOB = "/job"  # the job folder as the sandbox sees it
HOME = "/home/student"
COURSE = "/course"  # the course export
DATA = "/data"  # the course's data cache
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64")
SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/localtime", "/etc/passwd", "/etc/group", "/etc/nsswitch.conf",
                "/etc/hosts", "/etc/alternatives")
NOBODY = "65534"


@dataclass(frozen=True)
class Caps:
    """What one submission may use, as a whole (``course grade`` options of the same names)."""

    memory_mb: int = 4096
    processes: int = 512
    cpus: float = 1.0  # processors' worth of CPU time per sandbox (cgroup only)
    tmp_mb: int = 256
    home_mb: int = 64
    out_mb: int = 64
    shm_mb: int = 64


class SandboxError(RuntimeError):
    """The sandbox cannot be made here; the message names the fix."""


class SandboxFailure(RuntimeError):
    """One run failed in the sandbox's own machinery; the message is for the student, the detail is logged."""


def python_prefixes() -> list[str]:
    """The folders that hold this Python and its packages (a venv and the Python it was made from)."""
    found = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
    found.add(os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))))
    return sorted(p for p in found if not any(p != q and p.startswith(q + os.sep) for q in found))


def installed_copies(prefixes: list[str]) -> list[tuple[str, str]]:
    """(package, folder) for every installed copy of the course's packages inside the Python prefixes the
    sandbox sees (a wheel install): each gets the export laid over it, hiding its references and bytecode."""
    copies = []
    for prefix in prefixes:
        for package in export.PACKAGES:
            for folder in glob.glob(os.path.join(prefix, "lib", "python3*", "site-packages", package)):
                if os.path.isdir(folder):
                    copies.append((package, folder))
    return copies


def data_folder() -> str | None:
    """The course's data cache, lent read-only so that lessons reading the corpus can be graded."""
    from course_utils.data import cache_dir

    folder = cache_dir()
    return str(folder.resolve()) if folder.is_dir() else None


def environment(home: str, tmp: str, threads: int, course: str, data: str | None) -> dict[str, str]:
    """The allow-list: all the submission's environment, nothing of the grader's."""
    env = {"PATH": f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin", "HOME": home,
           "TMPDIR": tmp, "LANG": "C.UTF-8", "PYTHONPATH": course, "PYTHONDONTWRITEBYTECODE": "1",
           "COURSE_MODE": "smoke", "COURSE_NO_DOWNLOAD": "1", "TQDM_DISABLE": "1", "MPLBACKEND": "Agg",
           "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "JUPYTER_PLATFORM_DIRS": "1",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if data:
        env["COURSE_DATA"] = data
    return env


# /proc files that count for the whole machine, not the sandbox: each is masked by a read-only copy
# with plausible fixed content. /proc/stat keeps one line per processor (glibc counts them there
# when /sys is absent, as here: os.cpu_count, torch and numpy's thread pools) and /proc/meminfo
# states the sandbox's own memory cap.
PRESSURE = "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
EMPTY_COUNTERS = ("vmstat", "diskstats", "interrupts", "softirqs", "schedstat", "zoneinfo", "buddyinfo", "locks",
                  "sys/fs/file-nr", "sys/fs/inode-nr", "sys/kernel/random/entropy_avail")


def proc_masks(processors: int, memory_mb: int) -> dict[str, str]:
    """/proc path (relative) -> the neutral text the sandbox reads there instead."""
    zeros = " 0" * 10
    stat = f"cpu {zeros}\n" + "".join(f"cpu{n}{zeros}\n" for n in range(processors))
    stat += "intr 0\nctxt 0\nbtime 0\nprocesses 0\nprocs_running 1\nprocs_blocked 0\nsoftirq 0\n"
    kb = memory_mb * 1024
    meminfo = "".join(f"{name}:{value:>16} kB\n" for name, value in (
        ("MemTotal", kb), ("MemFree", kb), ("MemAvailable", kb), ("Buffers", 0), ("Cached", 0),
        ("SwapCached", 0), ("SwapTotal", 0), ("SwapFree", 0), ("Shmem", 0)))
    masks = {"loadavg": "0.00 0.00 0.00 1/1 1\n", "uptime": "0.00 0.00\n", "stat": stat, "meminfo": meminfo,
             "sys/kernel/random/boot_id": "00000000-0000-4000-8000-000000000000\n"}
    masks |= {f"pressure/{kind}": PRESSURE for kind in ("cpu", "io", "memory", "irq")}
    masks |= {name: "" for name in EMPTY_COUNTERS}
    return {name: text for name, text in masks.items() if os.path.exists(f"/proc/{name}")}


def write_proc_masks(folder: Path, caps: Caps) -> dict[str, Path]:
    """The masks written as read-only files in ``folder``: /proc path (relative) -> file to bind over it."""
    folder.chmod(0o755)
    memory_mb = caps.memory_mb if caps.memory_mb > 0 else Caps.memory_mb
    files = {}
    for name, text in proc_masks(os.cpu_count() or 1, memory_mb).items():
        files[name] = folder / name.replace("/", "-")
        files[name].write_text(text)
        files[name].chmod(0o444)
    return files


class Cgroup:
    """A cgroup (v1: one per controller; v2: one) capping memory, tasks and CPU of everything in it."""

    PERIOD_US = 100_000

    def __init__(self, dirs: list[Path], version: int, cpu: bool) -> None:
        self.dirs, self.version, self.cpu = dirs, version, cpu

    @classmethod
    def create(cls, name: str, caps: Caps) -> Cgroup | None:
        """A fresh cgroup under this process's own, or None where that is not allowed."""
        for make in (cls._create_v1, cls._create_v2):
            try:
                group = make(name, caps)
            except OSError:
                continue
            if group:
                return group
        return None

    @staticmethod
    def _own(controller: str) -> str | None:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if controller in controllers.split(","):
                return path
        return None

    @classmethod
    def _create_v1(cls, name: str, caps: Caps) -> Cgroup | None:
        dirs = []
        for controller in ("memory", "pids", "cpu"):
            own, mount = cls._own(controller), Path("/sys/fs/cgroup") / controller
            if own is None or not (mount / "cgroup.procs").exists():
                if controller == "cpu":
                    break  # no CPU share here; memory and tasks are still capped
                return None
            dirs.append(mount / own.lstrip("/") / name)
        group = cls(dirs, 1, cpu=len(dirs) == 3)
        made = []
        try:
            for folder in dirs:
                folder.mkdir()
                made.append(folder)
            memory = str(caps.memory_mb * 2**20)
            if caps.memory_mb > 0:
                (dirs[0] / "memory.limit_in_bytes").write_text(memory)
            if caps.memory_mb > 0 and (dirs[0] / "memory.memsw.limit_in_bytes").exists():
                (dirs[0] / "memory.memsw.limit_in_bytes").write_text(memory)
            (dirs[1] / "pids.max").write_text(str(caps.processes))
            if group.cpu:
                (dirs[2] / "cpu.cfs_period_us").write_text(str(cls.PERIOD_US))
                (dirs[2] / "cpu.cfs_quota_us").write_text(str(max(1000, int(caps.cpus * cls.PERIOD_US))))
        except OSError:
            cls(made, 1, cpu=False).remove()
            raise
        return group

    @classmethod
    def _create_v2(cls, name: str, caps: Caps) -> Cgroup | None:
        own = next((line[3:] for line in Path("/proc/self/cgroup").read_text().splitlines()
                    if line.startswith("0::")), None)
        mount = next((m for m in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))
                      if (m / "cgroup.subtree_control").exists()), None)
        if own is None or mount is None:
            return None
        parent = mount / own.lstrip("/")
        enabled = set((parent / "cgroup.subtree_control").read_text().split())
        if not {"memory", "pids"} <= enabled:
            return None
        group = cls([parent / name], 2, cpu="cpu" in enabled)
        group.dirs[0].mkdir()
        try:
            if caps.memory_mb > 0:
                (group.dirs[0] / "memory.max").write_text(str(caps.memory_mb * 2**20))
                (group.dirs[0] / "memory.swap.max").write_text("0")
            (group.dirs[0] / "pids.max").write_text(str(caps.processes))
            if group.cpu:
                (group.dirs[0] / "cpu.max").write_text(f"{max(1000, int(caps.cpus * cls.PERIOD_US))} {cls.PERIOD_US}")
        except OSError:
            group.remove()
            raise
        return group

    def enter(self, command: list[str]) -> list[str]:
        """``command`` started from a shell that first moves itself into this cgroup."""
        script = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 97; shift; done; shift; exec "$@"'
        return ["/bin/sh", "-c", script, "sh", *(str(d / "cgroup.procs") for d in self.dirs), "--", *command]

    def pids(self) -> list[int]:
        found: set[int] = set()
        for folder in self.dirs:
            try:
                found |= {int(p) for p in (folder / "cgroup.procs").read_text().split()}
            except (OSError, ValueError):
                pass
        return sorted(found)

    def remove(self, patience: float = 30.0) -> bool:
        """Kill whatever is still inside (nothing, normally: the PID namespace is gone), then delete
        every folder; both retried, since a dying process keeps its group busy for a moment. Returns
        whether all folders are gone (if not, the instructor's log names them)."""
        deadline = time.monotonic() + patience
        left = [d for d in self.dirs if d.exists()]
        while left:
            for pid in self.pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            for folder in list(left):
                try:
                    folder.rmdir()
                except FileNotFoundError:
                    pass
                except OSError:
                    continue
                left.remove(folder)
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if left:
            LOG.error("cgroup folders could not be removed: %s", ", ".join(map(str, left)))
        return not left


@dataclass
class RunResult:
    files: dict[str, bytes]  # what the worker sent back: the exercises' outputs (NAME.safetensors)
    report: RunReport  # its run.json, checked, with host paths in the errors made public
    killed: bool  # ran past the wall-clock limit and was ended from outside


class Sandbox:
    """Runs the grading worker on one job folder, isolated (``enabled``) or not (``--no-sandbox``)."""

    def __init__(self, caps: Caps, enabled: bool = True, threads: int = 1) -> None:
        self.caps, self.enabled, self.threads = caps, enabled, threads
        self.prefixes = python_prefixes()
        self.bwrap = shutil.which("bwrap")
        self.limiter = "none"
        self.data = data_folder()
        self.exports: dict[str | None, Path] = {}
        self.data_views: dict[str | None, Path] = {}  # a lesson's data folder without its held-out text
        masks = Path(tempfile.mkdtemp(prefix="course-grade-proc-"))
        self.proc_masks = write_proc_masks(masks, caps)
        self._export_lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _remove_all, self.exports)
        self._data_finalizer = weakref.finalize(self, _remove_all, self.data_views)
        self._masks_finalizer = weakref.finalize(self, shutil.rmtree, masks, True)

    def check(self) -> None:
        """Make one sandbox that runs this Python, and probe for a cgroup; raise SandboxError naming the fix."""
        probe = Cgroup.create(f"course-grade-probe-{os.getpid()}", self.caps)
        self.limiter = "rlimits"
        if probe:
            self.limiter = f"cgroup v{probe.version}" + ("" if probe.cpu else " (no cpu controller)")
            probe.remove()
        try:
            self.export(None)
        except export.ExportError as exc:
            raise SandboxError(str(exc)) from None
        if not self.enabled:
            return
        if not self.bwrap:
            raise SandboxError("bubblewrap (bwrap) is not installed: install it (e.g. apt-get install bubblewrap)")
        if seccomp.available():
            raise SandboxError(seccomp.available())
        done = self._start(None, None, ["-c", "import course_tools.grading"], capture=True)
        if done.returncode != 0:
            reason = (done.stderr.decode(errors="replace").strip().splitlines() or ["no message"])[-1]
            raise SandboxError(f"bubblewrap cannot make the sandbox here ({reason[:200]})")

    def describe(self) -> str:
        if self.limiter.startswith("cgroup"):
            caps = (f"{self.limiter}: {self.caps.memory_mb} MB, {self.caps.processes} tasks"
                    + ("" if "no cpu" in self.limiter else f" and {self.caps.cpus:g} CPU") + " per submission")
        else:
            caps = f"no cgroup here: per-process rlimits (address space {self.caps.memory_mb} MB), no CPU share"
        if not self.enabled:
            return f"NO SANDBOX (--no-sandbox: submissions run as this user and can see this machine); {caps}"
        return ("bubblewrap sandbox per submission, keyring calls and file locks filtered, /proc counters masked; "
                + caps)

    def export(self, lesson: str | None, pristine_sources: list[str] | None = None) -> Path:
        """The course export for ``lesson`` (made once per grading run)."""
        with self._export_lock:
            if lesson not in self.exports:
                self.exports[lesson] = export.make(lesson, pristine_sources or [])
            return self.exports[lesson]

    def data_for(self, lesson: str | None) -> str | None:
        """The data folder lent to ``lesson``'s sandbox: the cache, or for a lesson that is judged on
        held-out text (``held_out``) a copy of the corpus without it (made once per grading run)."""
        if not held_out.fraction(lesson) or self.data is None:
            return self.data
        with self._export_lock:
            if lesson not in self.data_views:
                self.data_views[lesson] = held_out.excerpt_folder(lesson)
            return str(self.data_views[lesson])

    def host_paths(self) -> list[tuple[str, str]]:
        """(host path, neutral name) pairs to clean out of text a student sees, longest first."""
        pairs = [(str(ROOT), "<course>"), (tempfile.gettempdir(), "<tmp>"), (str(Path.home()), "<home>")]
        pairs += [(str(p), "<export>") for p in self.exports.values()]
        pairs += [(p, "<python>") for p in self.prefixes]
        pairs += [(str(p), DATA) for p in self.data_views.values()]
        if self.data:
            pairs.append((self.data, DATA))
        return sorted({(h, n) for h, n in pairs if len(h) > 1}, key=lambda pair: -len(pair[0]))

    def public(self, text: str) -> str:
        """``text`` with the grader's host paths replaced by neutral names."""
        for host, neutral in self.host_paths():
            text = text.replace(host, neutral)
        return text

    def bwrap_args(self, jobdir: Path | None, course: Path, data: str | None = None) -> list[str]:
        """bubblewrap's options (they go through a pipe, not the command line); ``data``: the data folder
        to lend (default: the cache)."""
        data = data or self.data
        args = ["--unshare-all", "--unshare-user", "--uid", NOBODY, "--gid", NOBODY,
                "--hostname", "grading", "--die-with-parent", "--new-session", "--clearenv"]
        for key, value in environment(HOME, "/tmp", self.threads, COURSE, DATA if data else None).items():
            args += ["--setenv", key, value]
        for path in SYSTEM_DIRS:
            if os.path.islink(path):
                args += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                args += ["--ro-bind", path, path]
        for path in SYSTEM_FILES:
            args += ["--ro-bind-try", path, path]
        args += ["--proc", "/proc", "--ro-bind", "/dev/null", "/proc/keys"]
        for name, path in self.proc_masks.items():
            args += ["--ro-bind", str(path), f"/proc/{name}"]
        args += ["--dev", "/dev",
                 "--size", str(self.caps.shm_mb * 2**20), "--tmpfs", "/dev/shm"]
        args += ["--size", str(self.caps.tmp_mb * 2**20), "--tmpfs", "/tmp",
                 "--size", str(self.caps.home_mb * 2**20), "--tmpfs", HOME]
        for path in self.prefixes:
            args += ["--ro-bind", path, path]
        for package, folder in installed_copies(self.prefixes):
            args += ["--ro-bind", str(course / package), folder]
        args += ["--ro-bind", str(course), COURSE]
        if data:
            args += ["--ro-bind", data, DATA]
        if jobdir is not None:
            args += ["--ro-bind", str(jobdir), JOB, "--size", str(self.caps.out_mb * 2**20), "--tmpfs", f"{JOB}/out"]
        return [*args, "--remount-ro", "/", "--chdir", HOME]

    def _start(self, jobdir: Path | None, course: Path | None, python_args: list[str], capture: bool = False,
               keep_fds: tuple[int, ...] = (), group: Cgroup | None = None, data: str | None = None):
        """Start ``python PYTHON_ARGS`` in the sandbox (a fresh session keyring, the seccomp filter,
        bubblewrap's options through a pipe). Returns the Popen, or, with ``capture``, its finished run."""
        course = course or self.export(None)
        options = "\0".join(self.bwrap_args(jobdir, course, data)).encode() + b"\0"
        args_read, args_write = os.pipe()
        filter_fd = seccomp.bpf_file()
        try:
            if len(options) > 60_000:
                raise SandboxFailure("bubblewrap's options do not fit one pipe write")
            os.write(args_write, options)
            os.close(args_write)
            args_write = -1
            command = [*seccomp.launcher(sys.executable), self.bwrap, "--args", str(args_read),
                       "--seccomp", str(filter_fd), "--", sys.executable, *python_args]
            if group:
                command = group.enter(command)
            fds = (args_read, filter_fd, *keep_fds)
            if capture:
                return subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, timeout=120,
                                      pass_fds=fds)
            return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, pass_fds=fds, cwd=jobdir, start_new_session=True)
        finally:
            for fd in (args_read, args_write, filter_fd):
                if fd >= 0:
                    os.close(fd)

    def job_spec(self, jobdir: Path, limits: Limits, channel_fd: int, course: Path,
                 data: str | None = None) -> JobSpec:
        """What the worker needs to know about where it runs and which per-process limits to set."""
        rlimits: dict[str, int] = {}
        if not self.limiter.startswith("cgroup"):
            if self.caps.memory_mb > 0:
                rlimits["address_space"] = self.caps.memory_mb * 2**20
            if os.geteuid() != 0:  # RLIMIT_NPROC counts all of this user's processes, and never binds root
                rlimits["processes"] = own_processes() + self.caps.processes
        (jobdir / "out").mkdir()  # in the sandbox, only the mount point of its private output folder
        if not self.enabled:
            rlimits["file_size"] = self.caps.out_mb * 2**20
            home = jobdir / "home"
            home.mkdir()
            env = environment(str(home), str(home), self.threads, str(course), data or self.data)
            return JobSpec.make(limits, workdir=str(home), channel_fd=channel_fd, env=env, rlimits=rlimits,
                                confine_self=seccomp.available() is None)
        return JobSpec.make(limits, workdir=HOME, channel_fd=channel_fd, rlimits=rlimits)

    def kernel_jobdir(self, jobdir: Path) -> str:
        """The job folder as the worker and kernel see it."""
        return JOB if self.enabled else str(jobdir)

    def run(self, jobdir: Path, limits: Limits, wall_seconds: float, lesson: str | None = None,
            pristine_sources: list[str] | None = None) -> RunResult:
        """Write the job for the worker, run it on ``jobdir`` with the export for ``lesson``, collect
        what it sends through the results channel, and end everything it started by ``wall_seconds``
        at the latest. A failure of the sandbox itself raises SandboxFailure (detail in the log)."""
        try:
            return self._run(jobdir, limits, wall_seconds, lesson, pristine_sources)
        except Exception as exc:
            LOG.exception("sandbox run on %s failed", jobdir)
            raise SandboxFailure(f"the grading sandbox failed ({type(exc).__name__}); "
                                 "the instructor's log has the detail") from None

    def _run(self, jobdir: Path, limits: Limits, wall_seconds: float, lesson: str | None,
             pristine_sources: list[str] | None) -> RunResult:
        course = self.export(lesson, pristine_sources)
        data = self.data_for(lesson)
        read_fd, write_fd = os.pipe()
        group = Cgroup.create(f"course-grade-{os.getpid()}-{jobdir.name}", self.caps)
        try:
            self.job_spec(jobdir, limits, write_fd, course, data).write(jobdir / "job.json")
            worker = ["-m", "course_tools.grading.worker", self.kernel_jobdir(jobdir)]
            if self.enabled:
                proc = self._start(jobdir, course, worker, keep_fds=(write_fd,), group=group, data=data)
            else:
                env = JobSpec.read(jobdir / "job.json").env
                command = [sys.executable, *worker]
                proc = subprocess.Popen(group.enter(command) if group else command, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(write_fd,),
                                        env=env, cwd=jobdir, start_new_session=True)
            os.close(write_fd)
            write_fd = -1
            cap = (self.caps.out_mb + 2) * 2**20
            stream, killed = channel.collect(proc, read_fd, time.monotonic() + wall_seconds, cap)
            end(proc)
        finally:
            for fd in (read_fd, write_fd):
                if fd >= 0:
                    os.close(fd)
            if group:
                group.remove()
        files = channel.decode(stream)
        report = RunReport.read(files.pop("run.json", None))
        return RunResult(files, replace(report, errors={k: self.public(v) for k, v in report.errors.items()}), killed)


def _remove_all(folders: dict) -> None:
    for folder in folders.values():
        shutil.rmtree(folder, ignore_errors=True)


def own_processes() -> int:
    """How many processes this user runs now."""
    uid = str(os.getuid())
    count = 0
    for status in glob.glob("/proc/[0-9]*/status"):
        try:
            lines = Path(status).read_text().splitlines()
        except OSError:
            continue
        count += any(line.startswith("Uid:") and line.split()[1] == uid for line in lines)
    return count


def end(proc: subprocess.Popen) -> None:
    """Kill the worker's whole process group (with bubblewrap, that ends the PID namespace, so every
    process of the submission dies, stopped or not) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    proc.wait()
