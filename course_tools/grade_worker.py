"""The grader's worker process: runs one rebuilt submission in its own kernel, with limits.

Started by ``course grade`` as ``python -m course_tools.grade_worker JOBDIR``. It reads
``JOBDIR/job.json``, executes the notebook with nbclient (per-cell timeout, output cap), and writes
``JOBDIR/run.json``: which cells failed and how. It never sees the reference answers; the kernel
writes the learner's outputs to ``JOBDIR/outputs`` and the grader compares them itself.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import DeadKernelError

from course_tools.notebook_exec import execute, make_client


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


FORMAT_FAILURE = "Unexpected exception formatting exception"


def cell_errors(nb: nbformat.NotebookNode) -> dict[str, str]:
    """Index -> "Type: message" for every cell that raised. IPython sometimes cannot format a
    traceback and prints it as plain text instead; its last line then names the exception."""
    errors = {}
    for index, cell in enumerate(nb.cells):
        outputs = cell.get("outputs", [])
        for out in outputs:
            if out.get("output_type") == "error":
                value = str(out.get("evalue", "")).strip().splitlines()
                errors[str(index)] = f"{out.get('ename')}: {value[0] if value else ''}".rstrip(": ")
        text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
        if str(index) not in errors and FORMAT_FAILURE in text:
            last = [line for line in text.strip().splitlines() if line and not line.startswith(" ")][-1]
            errors[str(index)] = last.split(".")[-1] if last.startswith(("builtins.", "executing.")) else last
    return errors


class NotebookDeadline(Exception):
    """The whole notebook ran past its time limit."""


def main(jobdir: Path) -> int:
    job = json.loads((jobdir / "job.json").read_text())
    nb = nbformat.read(jobdir / "submission.ipynb", as_version=4)
    client = make_client(nb, Path(job["workdir"]), cell_timeout=job["cell_timeout"], allow_errors=True,
                         env={"COURSE_MODE": "smoke", "TQDM_DISABLE": "1", "COURSE_CHECKS_STRICT": "0"},
                         client_class=CappedClient, interrupt_on_timeout=True)
    client.output_cap = job["output_cap"]

    def deadline(signum, frame):
        raise NotebookDeadline()

    signal.signal(signal.SIGALRM, deadline)
    signal.alarm(job["notebook_timeout"])
    status = "finished"
    try:
        execute(client)
    except NotebookDeadline:
        status = "timeout"
    except DeadKernelError:  # a timed-out cell is interrupted (interrupt_on_timeout), so it never lands here
        status = "crashed"
    finally:
        signal.alarm(0)
    report = {"status": status, "errors": cell_errors(nb)}
    (jobdir / "run.json").write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
