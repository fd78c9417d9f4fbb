"""The kernel keyrings and file locks, out of a submission's reach: a seccomp filter and a fresh
session keyring.

Linux keeps secrets in kernel keyrings (a Kerberos login's ticket cache, for one) that every
process of the session can reach through three system calls, whatever its namespaces: a user
namespace does not hide them and bubblewrap adds no filter of its own. So each sandbox

* starts in a new, anonymous session keyring (``keyctl(KEYCTL_JOIN_SESSION_KEYRING, NULL)``,
  done by a tiny launcher before bubblewrap), so nothing of the grader's session is linked from it;
* runs under a seccomp filter, built with libseccomp (PyPI's ``pyseccomp``: ctypes over the
  system's ``libseccomp2``), that refuses ``add_key``, ``keyctl`` and ``request_key`` with EPERM.
  bubblewrap loads it (``--seccomp FD``) just before it starts the worker; without bubblewrap
  (``--no-sandbox``) the worker loads the same filter itself before the kernel starts. Calls made
  through another architecture's system-call table (``int 0x80``) end the process
  (libseccomp's default for architectures outside the filter).

The same filter refuses file locks (``flock`` and ``fcntl``'s lock commands) with ENOSYS, "not
implemented". A lock lives on the file's inode, and concurrent sandboxes share inodes they cannot
write: the system's Python, the course export, the host's ``/dev/null``. Taking and probing locks on
them was a covert channel between two submissions graded at once (issue 48: one spelled its answer
in locks, the other read and ran it). Private copies of every lockable file are out of reach (the
whole Python installation), and a mount namespace of its own does not help (a bind mount is the same
inode), so no process in a sandbox may lock at all. ENOSYS, because what runs there then fails at
once and clearly: SQLite reports an I/O error and IPython keeps its history in memory (ENOLCK, "no
locks available", makes SQLite retry as if busy: opening IPython's history took 21 s, not 1), and the
``filelock`` package falls back to lock files made with ``O_EXCL`` (it reads ENOSYS as a filesystem
without ``flock``; EPERM is an error), which a sandbox can only make in its own private folders.
Python, numpy, torch and the kernel take no locks otherwise. ``F_GETLK`` and ``F_OFD_GETLK`` are
refused too (they would show the locks of processes outside the sandbox). ``sysinfo``, which returns
the machine's load, uptime and free memory whatever ``/proc`` shows (glibc's ``getloadavg`` uses it),
fails with ENOSYS; the sandbox masks those files in ``/proc`` (``course_tools.grading.sandbox``).

Where ``pyseccomp`` or ``libseccomp2`` is missing, ``available()`` says so and the grader refuses to
grade in a sandbox: a NOTE in the gradebook would not take back a secret already read.
"""

from __future__ import annotations

import errno
import os
import tempfile

BLOCKED_CALLS = ("add_key", "keyctl", "request_key")
LOCK_CALL = "flock"
HOST_COUNTERS_CALL = "sysinfo"
# fcntl's lock commands (<fcntl.h>, the same numbers on every Linux architecture): F_GETLK, F_SETLK,
# F_SETLKW, F_OFD_GETLK, F_OFD_SETLK, F_OFD_SETLKW.
FCNTL_LOCKS = (5, 6, 7, 36, 37, 38)
KEYCTL_JOIN_SESSION_KEYRING = 1
# Run as ``python -S -c LAUNCHER KEYCTL_NR PROGRAM ARGS...``: join a fresh session keyring, then exec.
LAUNCHER = ("import ctypes, os, sys\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            f"if libc.syscall(int(sys.argv[1]), {KEYCTL_JOIN_SESSION_KEYRING}, None) < 0:\n"
            "    sys.exit(96)\n"
            "os.execv(sys.argv[2], sys.argv[2:])\n")
MISSING = ("the seccomp filter that keeps submissions away from the kernel keyrings needs pyseccomp and "
           "libseccomp2: pip install pyseccomp (and e.g. apt-get install libseccomp2)")


def _library():
    """The pyseccomp module, or None where it (or the libseccomp it wraps) cannot be loaded."""
    try:
        import pyseccomp
    except (ImportError, OSError, AttributeError):  # no module, or no libseccomp.so under it
        return None
    return pyseccomp


def available() -> str | None:
    """None if the filter can be built here, else the one-line reason and fix."""
    return None if _library() is not None else MISSING


def build():
    """The filter: allow everything but the keyring calls, which fail with EPERM, and file locks and
    ``sysinfo``, which fail with ENOSYS."""
    seccomp = _library()
    if seccomp is None:
        raise RuntimeError(MISSING)
    rules = seccomp.SyscallFilter(seccomp.ALLOW)
    for call in BLOCKED_CALLS:
        rules.add_rule(seccomp.ERRNO(errno.EPERM), call)
    rules.add_rule(seccomp.ERRNO(errno.ENOSYS), HOST_COUNTERS_CALL)
    rules.add_rule(seccomp.ERRNO(errno.ENOSYS), LOCK_CALL)
    for command in FCNTL_LOCKS:
        # the kernel reads cmd as 32 bits: compare those only, or high bits set by hand would slip past
        rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "fcntl", seccomp.Arg(1, seccomp.MASKED_EQ, 0xFFFFFFFF, command))
    return rules


def bpf_file() -> int:
    """A file descriptor (at offset 0, unlinked) holding the compiled filter, for ``bwrap --seccomp``."""
    handle = tempfile.TemporaryFile()
    build().export_bpf(handle)
    handle.flush()
    fd = os.dup(handle.fileno())
    handle.close()
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def keyctl_number() -> int:
    """This machine's system-call number of ``keyctl`` (it differs between architectures)."""
    seccomp = _library()
    if seccomp is None:
        raise RuntimeError(MISSING)
    return int(seccomp.resolve_syscall(seccomp.Arch.NATIVE, "keyctl"))


def launcher(python: str) -> list[str]:
    """The command prefix that starts what follows in a fresh, anonymous session keyring."""
    return [python, "-S", "-c", LAUNCHER, str(keyctl_number())]


def confine_self() -> None:
    """For a process not started by bubblewrap: a fresh session keyring, then the filter (for
    this process and everything it starts). Raises if either cannot be had."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(keyctl_number(), KEYCTL_JOIN_SESSION_KEYRING, None) < 0:
        raise OSError(ctypes.get_errno(), "cannot join a fresh session keyring")
    build().load()
