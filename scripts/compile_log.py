"""Where the test suite's time goes to Numba: every compile, its seconds and its test.

Most of a cold run of the suite is Numba compiling kernel specialisations (a kernel per
dtype, mod structure, serial or parallel, BLAS or loops, mask kind).  This file is both a
pytest plugin that records them and the script that sums them up.

Record (one JSON file per pytest-xdist worker; use an empty ``NUMBA_CACHE_DIR`` to see a
cold run, as on a fresh clone)::

    NUMBA_CACHE_DIR=/tmp/cold PYTHONPATH=scripts COMPILE_LOG=/tmp/compiles \\
        .venv/bin/python -m pytest -p compile_log -n logical --dist loadfile tests/test_mods.py

Sum up: by kernel, by test file, and the signatures that differ from another one of the
same kernel only in an argument you name (``--axis 3`` for the mask of the forward)::

    .venv/bin/python scripts/compile_log.py /tmp/compiles

Only real compiles are recorded (Numba's ``numba:compile`` event, which a disk-cache hit
does not fire), and only the outermost one: the helpers a kernel compiles on the way are
counted in the kernel's seconds.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import threading
import time

# --- the pytest plugin ------------------------------------------------------------------

_records: list[dict] = []
_test = {"id": None}
_depth = threading.local()


def pytest_configure(config):
    from numba.core import event

    class Outermost(event.Listener):
        def on_start(self, ev):
            level = getattr(_depth, "level", 0)
            if level == 0:
                _depth.start = time.perf_counter()
            _depth.level = level + 1

        def on_end(self, ev):
            _depth.level -= 1
            if _depth.level:
                return
            function = getattr(ev.data["dispatcher"], "py_func", None)
            _records.append({
                "kernel": f"{getattr(function, '__module__', '?')}."
                          f"{getattr(function, '__qualname__', '?')}",
                "args": [re.sub(r"0x[0-9a-f]+", "", str(a)) for a in ev.data["args"]],
                "seconds": time.perf_counter() - _depth.start,
                "test": _test["id"],
            })

    event.register("numba:compile", Outermost())


def pytest_runtest_setup(item):
    _test["id"] = item.nodeid


def pytest_unconfigure(config):
    prefix = os.environ.get("COMPILE_LOG", "compiles")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(f"{prefix}.{worker}.json", "w", encoding="utf-8") as handle:
        json.dump(_records, handle)


# --- the summary ------------------------------------------------------------------------

def _load(prefix: str) -> list[dict]:
    records = []
    for path in sorted(glob.glob(f"{prefix}.*.json")):
        records += json.load(open(path, encoding="utf-8"))
    return records


def _table(title: str, rows, limit: int) -> None:
    print(f"\n{title}")
    for seconds, count, name in sorted(rows, reverse=True)[:limit]:
        print(f"{seconds:9.1f} s {count:5d}  {name}")


def summarize(prefix: str, *, limit: int = 25, axis: int | None = None) -> None:
    records = _load(prefix)
    if not records:
        raise SystemExit(f"no {prefix}.*.json: run pytest with -p compile_log first")
    total = sum(r["seconds"] for r in records)
    print(f"{len(records)} compiles, {total:.0f} s ({prefix}.*.json)")
    for title, key in (("by kernel (seconds, compiles)", lambda r: r["kernel"]),
                       ("by test file", lambda r: (r["test"] or "(collection)").split("::")[0])):
        groups = collections.defaultdict(list)
        for r in records:
            groups[key(r)].append(r["seconds"])
        _table(title, [(sum(s), len(s), name) for name, s in groups.items()], limit)
    if axis is not None:
        groups = collections.defaultdict(set)
        for r in records:
            rest = tuple(a for i, a in enumerate(r["args"]) if i != axis)
            if axis < len(r["args"]):
                groups[(r["kernel"], rest)].add(r["args"][axis])
        split = [(len(v) - 1, k[0], sorted(v)) for k, v in groups.items() if len(v) > 1]
        print(f"\nsignatures that differ only in argument {axis}: "
              f"{sum(n for n, _, _ in split)} compiles more than needed")
        for n, kernel, values in sorted(split, reverse=True)[:limit]:
            print(f"  +{n} {kernel}: {values}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prefix", help="the COMPILE_LOG prefix the plugin wrote")
    parser.add_argument("--limit", type=int, default=25, help="rows per table")
    parser.add_argument("--axis", type=int, help="position of a kernel argument to study")
    args = parser.parse_args(argv)
    summarize(args.prefix, limit=args.limit, axis=args.axis)


if __name__ == "__main__":
    main()
