"""``course run``: execute lessons headless, record mode and device, optionally store the outputs.

This is how the stored outputs of ``notebooks/`` and ``solutions/`` are made, and how a lecturer
pre-runs the course on a GPU server before class.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import nbformat
from nbclient.exceptions import CellExecutionError, CellTimeoutError

from course_tools.notebook_exec import execute, make_client
from course_utils import runtime

SLOW_CELL_S = 5.0  # a cell a lecturer would rather pre-run than wait for


class CellClock:
    """Wall-clock seconds of every code cell, with the section heading it sits under, so a
    lecturer can see which cells to pre-run (nbclient calls ``start``/``stop`` around each cell)."""

    def __init__(self, nb: nbformat.NotebookNode) -> None:
        self.cells, self._started, self.sections, heading = [], 0.0, [], ""
        for c in nb.cells:  # sections[i]: the last heading before cell i, also one mid-cell
            self.sections.append(heading)
            if c.cell_type == "markdown":
                heading = next((line.lstrip("# ") for line in reversed(c.source.splitlines())
                                if line.startswith("#")), heading)

    def start(self, cell: nbformat.NotebookNode, cell_index: int, **_) -> None:
        self._started = time.perf_counter()

    def stop(self, cell: nbformat.NotebookNode, cell_index: int, **_) -> None:
        self.cells.append({"index": cell_index, "id": cell.get("id"), "section": self.sections[cell_index],
                           "first_line": (cell.source.splitlines() or [""])[0][:80],
                           "seconds": round(time.perf_counter() - self._started, 2)})

    def slow(self, threshold: float = SLOW_CELL_S) -> list[dict]:
        return [c for c in self.cells if c["seconds"] > threshold]


def coalesce_streams(nb: nbformat.NotebookNode) -> None:
    """Join each code cell's adjacent stream outputs of the same name (stdout, stderr) into one, as
    Jupyter shows them: a kernel flushes a print in one or more messages depending on timing, and the
    stored notebook should not depend on that (the Korean build matches a cell's output as one text)."""
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        joined: list = []
        for out in cell.get("outputs", []):
            previous = joined[-1] if joined else None
            if (out.output_type == "stream" and previous is not None and previous.output_type == "stream"
                    and previous.name == out.name):
                previous.text += out.text
            else:
                joined.append(out)
        cell.outputs = joined


def run_notebook(path: Path, mode: str, inplace: bool, cell_timeout: int, out_dir: Path | None = None) -> dict:
    """Execute one notebook in ``mode``; return a row of the summary table (with per-cell times).
    The executed notebook is written back with ``inplace``, or as a copy of the same name into ``out_dir``."""
    nb = nbformat.read(path, as_version=4)
    env = {"COURSE_MODE": mode, "TQDM_DISABLE": "1"}
    clock = CellClock(nb)
    client = make_client(nb, path.parent.resolve(), cell_timeout=cell_timeout, env=env,
                         on_cell_execute=clock.start, on_cell_executed=clock.stop)
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    status = "ok"
    try:
        execute(client)
    except CellTimeoutError:
        status = "timeout"
    except CellExecutionError as exc:
        status = f"error: {exc.ename}: {exc.evalue}"[:160]
    seconds = time.perf_counter() - start
    load_after = os.getloadavg()[0]
    device = str(runtime.device())
    if status == "ok":
        # the run's record: the prose may quote its time and load (the prose-number check reads them here)
        nb.metadata["course"] = {**nb.metadata.get("course", {}), "mode": mode, "device": device,
                                 "seconds": round(seconds, 1),
                                 "load": [round(load_before, 2), round(load_after, 2)]}
        coalesce_streams(nb)
        if inplace:
            nbformat.write(nb, path)
        if out_dir is not None:
            nbformat.write(nb, out_dir / path.name)
    return {"notebook": str(path), "mode": mode, "device": device, "seconds": seconds, "status": status,
            "load_before": round(load_before, 2), "load_after": round(load_after, 2),
            "cells": clock.cells, "slow_cells": clock.slow()}


def print_table(rows: list[dict]) -> None:
    width = max([len("notebook")] + [len(r["notebook"]) for r in rows])
    print(f"{'notebook':<{width}}  {'mode':<5}  {'device':<6}  {'seconds':>8}  status")
    for r in rows:
        print(f"{r['notebook']:<{width}}  {r['mode']:<5}  {r['device']:<6}  {r['seconds']:>8.1f}  {r['status']}")
        for c in r["slow_cells"]:
            print(f"  slow cell {c['index']} ({c['seconds']:.1f} s) in '{c['section']}': {c['first_line']}")


def main(args: argparse.Namespace) -> int:
    mode = args.mode or runtime.mode()
    if mode not in runtime.MODES:
        raise SystemExit(f"--mode must be one of {', '.join(runtime.MODES)}, got {mode!r}")
    if args.inplace and mode == "smoke":
        raise SystemExit("stored outputs must come from a cpu or gpu run; use --mode cpu or --mode gpu")
    missing = [p for p in args.notebooks if not Path(p).is_file()]
    if missing:
        raise SystemExit(f"no such notebook: {', '.join(missing)}")
    if args.inplace and args.out_dir:
        raise SystemExit("choose one of --inplace and --out-dir")
    out_dir = Path(args.out_dir) if args.out_dir else None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    os.environ["COURSE_MODE"] = mode  # so runtime.device()/mode() below agree with the kernels
    rows = [run_notebook(Path(p), mode, args.inplace, args.cell_timeout, out_dir) for p in args.notebooks]
    print_table(rows)
    if args.timings:
        Path(args.timings).write_text(json.dumps(rows, indent=1, ensure_ascii=False) + "\n")
    return 0 if all(r["status"] == "ok" for r in rows) else 1


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="execute notebooks headless (and store their outputs with --inplace)")
    p.add_argument("notebooks", nargs="+", metavar="NOTEBOOK", help="the .ipynb files to execute, in order")
    p.add_argument("--mode", choices=runtime.MODES, help="run mode (default: COURSE_MODE or by hardware)")
    p.add_argument("--inplace", action="store_true", help="write the executed notebook back (not in smoke mode)")
    p.add_argument("--out-dir", metavar="DIR", help="write each executed notebook into DIR (any mode)")
    p.add_argument("--cell-timeout", type=int, default=1800, help="seconds per cell (default 1800)")
    p.add_argument("--timings", metavar="FILE.json",
                   help="write each notebook's total and per-cell seconds and the load average to this file")
    p.set_defaults(func=main)
