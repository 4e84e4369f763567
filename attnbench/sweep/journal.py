"""The sweep journal: every finished point appended to disk at once, and ``--resume``.

``attnbench sweep`` writes ``OUT/sweep.jsonl`` beside ``sweep.csv``: one JSON object
per line, each line flushed and ``fsync``'d as soon as its point finishes, so that a
sweep stopped by Ctrl-C, a crash, a killed worker or a lost client keeps every point
that finished.  Lines are:

- ``{"type": "header", ...}``: the format, when the journal was started, the sweep's
  settings (timing budget, threads, ...);
- ``{"type": "row", "key": KEY, "row": {...}}``: one finished point (its whole row);
- ``{"type": "machine", "host": HOST, "record": {...}}``: the full machine record
  (:func:`attnbench.measure.machine.machine_record`) of a host, the first time a row of it comes.

A point's identity is :func:`point_key`, a stable string of its parameters (backend,
L, d_k, heads, kv_heads, batch, mask, dtype).  Re-running the same sweep with
``--resume`` (:func:`load_journal`, :func:`journaled`) takes the rows of the points
already *done* from the journal (status ``ok`` or ``skipped``; the last row of a key
wins) and runs only the others: points never finished, and those that ``failed`` (a
failure may have been a dead worker: it is tried again).  A line cut short by a crash
is ignored.  Rows carry ``run_id`` (the sweep invocation that measured them) and
``resumed`` (True for a row taken from the journal).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path

from attnbench.measure.machine import machine_columns, machine_record
from attnbench.sweep.grid import Point
from attnbench.sweep.run import runs_here

__all__ = ["DONE_STATUSES", "JOURNAL_NAME", "MACHINE_FIELD", "Journal", "JournalContents",
           "journaled", "load_journal", "point_key", "point_of_row"]

JOURNAL_NAME = "sweep.jsonl"
FORMAT = "attnbench-sweep-journal"
VERSION = 1
#: Statuses of a point that --resume does not run again.
DONE_STATUSES = ("ok", "skipped")
#: A row's field for its host's full machine record, on its way from a worker to the
#: journal (popped there: tables do not carry it).
MACHINE_FIELD = "_machine_record"

_POINT_FIELDS = tuple(f.name for f in fields(Point))


def point_key(point: Point) -> str:
    """The stable identity of a point: ``"numba|L=128|d_k=64|H=4|Hkv=4|B=1|none|float32"``.

    A backward point, one with a variant or of another kind than dense ends in
    ``|backward``, ``|window-64`` and ``|decode`` (the keys of dense forward points without
    a variant are those of journals written before these axes existed).
    """
    extra = "".join(f"|{value}" for value, default in ((point.direction, "forward"),
                                                       (point.variant, "none"),
                                                       (point.kind, "dense"))
                    if value != default)
    return (f"{point.backend}|L={point.L}|d_k={point.d_k}|H={point.heads}|Hkv={point.kv_heads}"
            f"|B={point.batch}|{point.mask}|{point.dtype}{extra}")


def point_of_row(row: dict) -> Point:
    """The point a row measured (the row holds the point's fields; rows of older journals
    lack ``direction``, ``variant`` and ``kind``: forward, none, dense)."""
    defaults = {"direction": "forward", "variant": "none", "kind": "dense"}
    values = {name: row.get(name, defaults.get(name)) for name in _POINT_FIELDS}
    for name in ("L", "d_k", "heads", "kv_heads", "batch"):
        values[name] = int(values[name])
    return Point(**values)


def _plain(value):
    """A JSON-able value: numpy scalars as Python ones, pandas' NA as None."""
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        return value
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", 0) == 0:
        return item()
    try:
        import pandas as pd

        if value is pd.NA or value is pd.NaT:
            return None
    except ImportError:  # pragma: no cover - pandas is a dependency
        pass
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return str(value)


def _brief_only(row: dict) -> bool:
    """A row timed briefly for a series pass that did not replace it."""
    return (bool(row.get("brief_timing")) and not row.get("series_interleaved")
            and not row.get("remeasured"))


@dataclass
class JournalContents:
    """What :func:`load_journal` found."""

    rows: dict[str, dict] = field(default_factory=dict)  # key -> last row of the key
    machines: dict[str, dict] = field(default_factory=dict)  # host -> machine record
    header: dict = field(default_factory=dict)
    unreadable_lines: int = 0  # lines that are not JSON (cut short by a crash)

    def done(self) -> dict[str, dict]:
        """Rows of the points that need not run again: skipped, or ok with their final
        timing (a brief first timing that the end-of-sweep pass never replaced, in a sweep
        interrupted before it, is not final: the point runs again)."""
        return {key: row for key, row in self.rows.items()
                if row.get("status") in DONE_STATUSES and not _brief_only(row)}


def load_journal(path) -> JournalContents:
    """Read a journal (missing file: empty contents)."""
    contents = JournalContents()
    path = Path(path)
    if not path.exists():
        return contents
    with open(path, encoding="utf-8") as file:
        for line in file:
            line = line.strip()
            if not line:
                continue
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                contents.unreadable_lines += 1
                continue
            kind = entry.get("type") if isinstance(entry, dict) else None
            if kind == "row":
                contents.rows[entry["key"]] = entry["row"]
            elif kind == "machine":
                contents.machines[entry["host"]] = entry["record"]
            elif kind == "header":
                contents.header = entry
            else:
                contents.unreadable_lines += 1
    return contents


class Journal:
    """An append-only JSON-lines file; every line is on disk when :meth:`append` returns.

    Parameters
    ----------
    path : path-like
    resume : bool
        Append to an existing journal (True) or start a new one (False: any old one is
        replaced).
    settings : dict, optional
        The sweep's settings, written in the header.
    """

    def __init__(self, path, *, resume: bool = False, settings: dict | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.run_id = f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:6]}"
        self.hosts: set[str] = set()
        existed = resume and self.path.exists() and self.path.stat().st_size > 0
        if existed:
            self.hosts = set(load_journal(self.path).machines)
        self._file = open(self.path, "a" if resume else "w", encoding="utf-8")
        if existed and not _ends_with_newline(self.path):
            self._file.write("\n")  # a line cut short by a crash stays on its own line
        self._write({"type": "header", "format": FORMAT, "version": VERSION,
                     "run_id": self.run_id, "started": datetime.now(UTC).isoformat(),
                     "resumed": bool(existed), "settings": _plain(settings or {})})

    def _write(self, entry: dict) -> None:
        self._file.write(json.dumps(entry, allow_nan=True) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def append(self, row: dict) -> dict:
        """Write a finished point's row (its machine record first, once per host).

        Returns the row as journaled: with ``point_key`` and ``run_id``, without the
        transient machine record.
        """
        row = dict(row)
        record = row.pop(MACHINE_FIELD, None)
        host = row.get("hostname")
        if record is not None and host is not None and host not in self.hosts:
            self.hosts.add(host)
            self._write({"type": "machine", "host": host, "record": _plain(record)})
        row.setdefault("point_key", point_key(point_of_row(row)))
        row.setdefault("run_id", self.run_id)
        row.setdefault("finished_at", time.time())
        row = {name: _plain(value) for name, value in row.items()}
        self._write({"type": "row", "key": row["point_key"], "row": row})
        return row

    def close(self) -> None:
        self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as file:
        file.seek(-1, os.SEEK_END)
        return file.read(1) == b"\n"


def journaled(executor, journal: Journal, done: dict[str, dict] | None = None):
    """An executor that skips the ``done`` points and journals every new row.

    Parameters
    ----------
    executor : callable
        ``executor(points, run_point)`` yielding rows (see :mod:`attnbench.sweep.runner`).
    journal : Journal
    done : dict, optional
        Rows of points not to run again, by :func:`point_key` (:meth:`JournalContents.done`).

    Returns
    -------
    callable
        An executor with the same signature: it first yields the done rows of the points
        asked for (``resumed=True``), then the rows of the others as they finish, each
        written to the journal before it is yielded.
    """
    done = done or {}

    def run(points: Sequence[Point], run_point) -> Iterator[dict]:
        todo = []
        for point in points:
            key = point_key(point)
            if key in done:
                yield {**done[key], "resumed": True}
            else:
                todo.append(point)
        for row in executor(todo, run_point):
            if "hostname" not in row:  # measured in this process: this host
                row = {**row, **machine_columns(), MACHINE_FIELD: machine_record()}
            row = journal.append(row)
            yield {**row, "resumed": False}

    run.local = runs_here(executor)
    run.journal = journal  # rows re-measured at the end of the sweep are journaled again
    return run

