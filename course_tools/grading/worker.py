"""The grader's worker: runs one rebuilt submission in its own kernel, inside the sandbox.

Started as ``python -m course_tools.grading.worker JOBDIR``. It reads ``JOBDIR/job.json`` (a
``course_tools.grading.job.JobSpec``), runs the
notebook with nbclient (time limits, output cap), then sends its report and the files the kernel
left in ``JOBDIR/out`` through the results channel (a pipe to the grader). It never sees the
references; the grader judges what comes back.
"""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import sys
from pathlib import Path

import nbformat
import zmq
import zmq.asyncio
from nbclient import NotebookClient
from nbclient.exceptions import DeadKernelError

from course_tools.grading import channel, seccomp
from course_tools.grading.job import JobSpec, RunReport
from course_tools.grading.submission import GRADER_CELL
from course_tools.notebook_exec import CurrentEnvKernelManager, execute, make_client

FORMAT_FAILURE = "Unexpected exception formatting exception"
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# the first frame of a cell's traceback is the cell itself ("Cell In[7], line 4", no ", in f()" after it)
CELL_FRAME = re.compile(r"(?:Cell In\[\d*\], line |File <IPY-INPUT>:)(\d+)\s*(?:\n|$)")
VALUE_CHARS = 200  # of an exception's message, so the line after it survives the grader's cuts
RLIMITS = {"address_space": resource.RLIMIT_AS, "processes": resource.RLIMIT_NPROC,
           "file_size": resource.RLIMIT_FSIZE}


class CappedClient(NotebookClient):
    """A NotebookClient that keeps at most ``output_cap`` characters of output per notebook."""

    output_cap = 100_000

    def output(self, outs, msg, display_id, cell_index):
        used = getattr(self, "_chars", 0)
        if used > self.output_cap:
            return None
        content = msg.get("content", {})
        size = len(json.dumps(content.get("text") or content.get("data") or content.get("traceback") or ""))
        self._chars = used + size
        if self._chars > self.output_cap:
            note = nbformat.v4.new_output("stream", name="stderr", text="[output cut: too much output]\n")
            outs.append(note)
            return note
        return super().output(outs, msg, display_id, cell_index)


class CappedMessagesKernelManager(CurrentEnvKernelManager):
    """Its clients drop (disconnect) any single kernel message over ``max_message_bytes``, so a huge
    display message never reaches this process whole."""

    max_message_bytes = 8 * 2**20

    def client(self, **kwargs):
        context = zmq.asyncio.Context()
        context.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
        return super().client(context=context, **kwargs)


def cell_line(traceback: object) -> int | None:
    """The line of the cell at which its own code raised: the first frame of its traceback, which
    IPython writes ``Cell In[7], line 4`` (later frames may be functions defined in other cells)."""
    if not isinstance(traceback, list):
        return None
    for entry in traceback:
        match = CELL_FRAME.match(ANSI.sub("", str(entry)))
        if match:
            return int(match.group(1))
    return None


def error_text(out: dict) -> str:
    """One error output as "Type: message", with "(line N)" of the cell where a run-time error raised
    (a SyntaxError's message names its line itself: "(<IPY-INPUT>, line N)")."""
    value = str(out.get("evalue", "")).strip().splitlines()
    text = f"{str(out.get('ename'))[:80]}: {value[0][:VALUE_CHARS] if value else ''}".rstrip(": ")
    line = None if "<IPY-INPUT>, line" in text else cell_line(out.get("traceback"))
    return f"{text} (line {line})" if line is not None else text


def cell_errors(nb: nbformat.NotebookNode) -> dict[str, str]:
    """Index -> "Type: message" (with the cell's line, ``error_text``) for every cell that raised.
    IPython sometimes cannot format a traceback and prints it as plain text instead; its last line
    then names the exception."""
    errors = {}
    for index, cell in enumerate(nb.cells):
        outputs = cell.get("outputs", [])
        for out in outputs:
            if out.get("output_type") == "error":
                errors[str(index)] = error_text(out)
        text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
        if str(index) not in errors and FORMAT_FAILURE in text:
            lines = [line for line in text.strip().splitlines() if line and not line.startswith(" ")]
            last = lines[-1] if lines else FORMAT_FAILURE
            errors[str(index)] = last.split(".")[-1] if last.startswith(("builtins.", "executing.")) else last
    return errors


class NotebookDeadline(Exception):
    """The whole notebook ran past its time limit."""


def apply_rlimits(limits: dict[str, int]) -> None:
    """Per-process limits (used where no cgroup caps the sandbox as a whole); the kernel inherits them."""
    for name, value in limits.items():
        resource.setrlimit(RLIMITS[name], (value, value))


def run_notebook(nb: nbformat.NotebookNode, job: JobSpec) -> str:
    """Execute every cell. Cells that run learner code (marked by the grader) get the per-cell limit;
    the pristine lesson cells get the notebook's, so a slow import on a busy machine is no timeout."""
    cell_timeout, notebook_timeout = job.cell_timeout, job.notebook_timeout

    def timeout(cell: nbformat.NotebookNode) -> int:
        return cell_timeout if cell.metadata.get(GRADER_CELL) == "timed" else notebook_timeout

    client = make_client(nb, Path(job.workdir), cell_timeout=cell_timeout, allow_errors=True, env=job.env or None,
                         client_class=CappedClient, interrupt_on_timeout=True, startup_timeout=notebook_timeout,
                         timeout_func=timeout, kernel_manager_class=CappedMessagesKernelManager)
    client.output_cap = job.output_cap

    def deadline(signum, frame):
        raise NotebookDeadline()

    signal.signal(signal.SIGALRM, deadline)
    signal.alarm(notebook_timeout)
    try:
        execute(client)
        return "finished"
    except NotebookDeadline:
        return "timeout"
    except DeadKernelError:
        return "crashed"
    finally:
        signal.alarm(0)


def outputs(folder: Path) -> dict[str, bytes]:
    """The regular files the kernel left in ``folder`` (bounded in number and size)."""
    files: dict[str, bytes] = {}
    try:
        names = sorted(os.listdir(folder))[: channel.MAX_FILES]
    except OSError:
        return files
    for name in names:
        data = channel.read_regular(str(folder / name))
        if data is not None:
            files[name] = data
    return files


def main(jobdir: Path) -> int:
    job = JobSpec.read(jobdir / "job.json")
    if job.confine_self:  # no bubblewrap loaded the filter: load it here, before any learner code runs
        seccomp.confine_self()
    apply_rlimits(job.rlimits)
    nb = nbformat.read(jobdir / "submission.ipynb", as_version=4)
    try:
        status = run_notebook(nb, job)
    except Exception:  # e.g. the kernel never came up: the grader reports the notebook as crashed
        status = "crashed"
    report = RunReport(status, cell_errors(nb))
    files = {**outputs(jobdir / "out"), "run.json": report.to_json()}
    channel.send(job.channel_fd, files)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
