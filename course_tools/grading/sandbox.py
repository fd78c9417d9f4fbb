"""One sandbox per submission: bubblewrap for what the submission can see, a cgroup for what it
can use, and a hard wall-clock limit enforced from outside.

Inside, the submission sees the system's programs and libraries, the Python installation and the
course's two packages, all read-only, with ``course_tools.references`` replaced by a stub; its
own job folder read-only; a private, size-limited ``/tmp``, ``$HOME`` and output folder; no
network; its own PID, IPC and user namespaces (it runs as ``nobody``); an allow-listed
environment. Memory and process count are capped for the sandbox as a whole with a cgroup (v1 or
v2, where this process may create one), else per process with rlimits. When the time is up or the
worker ends, the sandbox's PID namespace is torn down, which kills every process it started.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from course_tools.grading import channel

ROOT = Path(__file__).resolve().parents[2]
BLOCKED = Path(__file__).resolve().parent / "blocked"
JOB = "/job"  # the job folder as the sandbox sees it
HOME = "/home/student"
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64")
SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/localtime", "/etc/passwd", "/etc/group", "/etc/nsswitch.conf",
                "/etc/hosts", "/etc/alternatives")
NOBODY = "65534"


@dataclass
class Caps:
    """What one submission may use, as a whole."""

    memory_mb: int = 4096
    processes: int = 512
    tmp_mb: int = 256
    home_mb: int = 64
    out_mb: int = 64


class SandboxError(RuntimeError):
    """The sandbox cannot be made here; the message names the fix."""


def python_prefixes() -> list[str]:
    """The folders that hold this Python and its packages (a venv and the Python it was made from)."""
    found = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
    found.add(os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))))
    return sorted(p for p in found if not any(p != q and p.startswith(q + os.sep) for q in found))


def reference_folders(prefixes: list[str]) -> list[str]:
    """Every copy of ``course_tools/references`` the sandbox could reach: the checkout's and installed ones."""
    copies = [str(ROOT / "course_tools" / "references")]
    for prefix in prefixes:
        copies += glob.glob(os.path.join(prefix, "lib", "python3*", "site-packages", "course_tools", "references"))
    return [c for c in copies if os.path.isdir(c)]


def data_folder() -> str | None:
    """The course's data cache, lent read-only so that lessons reading the corpus can be graded."""
    from course_utils.data import cache_dir

    folder = cache_dir()
    return str(folder.resolve()) if folder.is_dir() else None


def environment(home: str, tmp: str, threads: int) -> dict[str, str]:
    """The allow-list: all the submission's environment, nothing of the grader's."""
    env = {"PATH": f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin", "HOME": home,
           "TMPDIR": tmp, "LANG": "C.UTF-8", "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1",
           "COURSE_MODE": "smoke", "COURSE_NO_DOWNLOAD": "1", "TQDM_DISABLE": "1", "MPLBACKEND": "Agg",
           "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "JUPYTER_PLATFORM_DIRS": "1",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    data = data_folder()
    if data:
        env["COURSE_DATA"] = data
    return env


class Cgroup:
    """A cgroup (v1: one per controller; v2: one) capping memory and tasks of everything in it."""

    def __init__(self, dirs: list[Path], version: int) -> None:
        self.dirs, self.version = dirs, version

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
        for controller in ("memory", "pids"):
            own, mount = cls._own(controller), Path("/sys/fs/cgroup") / controller
            if own is None or not (mount / "cgroup.procs").exists():
                return None
            dirs.append(mount / own.lstrip("/") / name)
        group = cls(dirs, 1)
        for folder in dirs:
            folder.mkdir()
        memory = str(caps.memory_mb * 2**20)
        try:
            if caps.memory_mb > 0:
                (dirs[0] / "memory.limit_in_bytes").write_text(memory)
            if caps.memory_mb > 0 and (dirs[0] / "memory.memsw.limit_in_bytes").exists():
                (dirs[0] / "memory.memsw.limit_in_bytes").write_text(memory)
            (dirs[1] / "pids.max").write_text(str(caps.processes))
        except OSError:
            group.remove()
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
        if not {"memory", "pids"} <= set((parent / "cgroup.subtree_control").read_text().split()):
            return None
        group = cls([parent / name], 2)
        group.dirs[0].mkdir()
        try:
            if caps.memory_mb > 0:
                (group.dirs[0] / "memory.max").write_text(str(caps.memory_mb * 2**20))
                (group.dirs[0] / "memory.swap.max").write_text("0")
            (group.dirs[0] / "pids.max").write_text(str(caps.processes))
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

    def remove(self) -> None:
        """Kill whatever is still inside (nothing, normally: the PID namespace is gone), then delete."""
        for _ in range(50):
            left = self.pids()
            if not left:
                break
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.1)
        for folder in self.dirs:
            try:
                folder.rmdir()
            except OSError:
                pass


@dataclass
class RunResult:
    files: dict[str, bytes]
    killed: bool  # ran past the wall-clock limit and was ended from outside


class Sandbox:
    """Runs the grading worker on one job folder, isolated (``enabled``) or not (``--no-sandbox``)."""

    def __init__(self, caps: Caps, enabled: bool = True, threads: int = 1) -> None:
        self.caps, self.enabled, self.threads = caps, enabled, threads
        self.prefixes = python_prefixes()
        self.bwrap = shutil.which("bwrap")
        self.limiter = "none"

    def check(self) -> None:
        """Make one sandbox that runs this Python, and probe for a cgroup; raise SandboxError naming the fix."""
        probe = Cgroup.create(f"course-grade-probe-{os.getpid()}", self.caps)
        self.limiter = f"cgroup v{probe.version}" if probe else "rlimits"
        if probe:
            probe.remove()
        if not self.enabled:
            return
        if not self.bwrap:
            raise SandboxError("bubblewrap (bwrap) is not installed: install it (e.g. apt-get install bubblewrap)")
        command = [*self.bwrap_args(None), "--", sys.executable, "-c", "import course_tools.grading"]
        done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
        if done.returncode != 0:
            reason = (done.stderr.decode(errors="replace").strip().splitlines() or ["no message"])[-1]
            raise SandboxError(f"bubblewrap cannot make the sandbox here ({reason[:200]})")

    def describe(self) -> str:
        if self.limiter.startswith("cgroup"):
            caps = f"{self.limiter}: {self.caps.memory_mb} MB and {self.caps.processes} tasks per submission"
        else:
            caps = f"no cgroup here: per-process rlimits (address space {self.caps.memory_mb} MB)"
        if not self.enabled:
            return f"NO SANDBOX (--no-sandbox: submissions run as this user and can see this machine); {caps}"
        return f"bubblewrap sandbox per submission; {caps}"

    def bwrap_args(self, jobdir: Path | None) -> list[str]:
        args = [self.bwrap, "--unshare-all", "--unshare-user", "--uid", NOBODY, "--gid", NOBODY,
                "--hostname", "grading", "--die-with-parent", "--new-session", "--clearenv"]
        for key, value in environment(HOME, "/tmp", self.threads).items():
            args += ["--setenv", key, value]
        for path in SYSTEM_DIRS:
            if os.path.islink(path):
                args += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                args += ["--ro-bind", path, path]
        for path in SYSTEM_FILES:
            args += ["--ro-bind-try", path, path]
        args += ["--proc", "/proc", "--dev", "/dev"]
        args += ["--size", str(self.caps.tmp_mb * 2**20), "--tmpfs", "/tmp",
                 "--size", str(self.caps.home_mb * 2**20), "--tmpfs", HOME]
        for path in [*self.prefixes, str(ROOT / "course_utils"), str(ROOT / "course_tools")]:
            args += ["--ro-bind", path, path]
        for path in reference_folders(self.prefixes):
            args += ["--ro-bind", str(BLOCKED), path]
        data = environment(HOME, "/tmp", 1).get("COURSE_DATA")
        if data:
            args += ["--ro-bind", data, data]
        if jobdir is not None:
            args += ["--ro-bind", str(jobdir), JOB, "--size", str(self.caps.out_mb * 2**20), "--tmpfs", f"{JOB}/out"]
        return [*args, "--remount-ro", "/", "--chdir", HOME]

    def job_settings(self, jobdir: Path) -> dict:
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
            return {"workdir": str(home), "env": environment(str(home), str(home), self.threads), "rlimits": rlimits}
        return {"workdir": HOME, "env": {}, "rlimits": rlimits}

    def kernel_jobdir(self, jobdir: Path) -> str:
        """The job folder as the worker and kernel see it."""
        return JOB if self.enabled else str(jobdir)

    def run(self, jobdir: Path, job: dict, wall_seconds: float) -> RunResult:
        """Write ``job`` for the worker, run it on ``jobdir``, collect what it sends through the
        results channel, and end everything it started by ``wall_seconds`` at the latest."""
        read_fd, write_fd = os.pipe()
        (jobdir / "job.json").write_text(json.dumps({**job, "channel_fd": write_fd}))
        worker = [sys.executable, "-m", "course_tools.grading.worker", self.kernel_jobdir(jobdir)]
        env = None
        if self.enabled:
            command = [*self.bwrap_args(jobdir), "--", *worker]
        else:
            command, env = worker, job["env"]
        group = Cgroup.create(f"course-grade-{os.getpid()}-{jobdir.name}", self.caps)
        if group:
            command = group.enter(command)
        try:
            proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, pass_fds=(write_fd,), env=env,
                                    cwd=jobdir, start_new_session=True)
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
        return RunResult(channel.decode(stream), killed)


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
