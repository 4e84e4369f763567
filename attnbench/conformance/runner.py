"""The runner: each implementation in its own subprocess with a time limit, then verdicts.

:func:`conform` starts :mod:`attnbench.conformance.worker` once per implementation
(``python -m attnbench.conformance.worker``, its own session so a hang is killed with
its children), waits at most ``timeout`` seconds, and reads what the worker wrote.  An
implementation that raises is reported per check (``error``, with the exception); one
that hangs is killed and reported ``timed out after S s during <property>``; one that
kills its interpreter (``os._exit``, a segfault) is reported with its exit status or
signal; in both cases the properties it finished keep their results, and the other
implementations still run.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from attnbench.conformance.battery import all_checks, property_order
from attnbench.measure.problems import load_average

__all__ = ["DEFAULT_TIMEOUT", "conform", "exit_status", "verdict"]

#: Seconds one implementation may take, battery and speed section included.
DEFAULT_TIMEOUT = 600.0


def verdict(properties: list[dict], *, deterministic: bool = False,
            problem: str | None = None) -> str:
    """``fails`` if a deciding property failed, ``error`` if one could not be decided or
    the process hung, died or could not load (``problem``), else ``conforms``.
    Deciding: correctness, and determinism with ``deterministic``."""
    deciding = {"correctness"} | ({"determinism"} if deterministic else set())
    statuses = [p["status"] for p in properties if p["kind"] in deciding]
    if "fail" in statuses:
        return "fails"
    if "error" in statuses or not statuses or problem:
        return "error"
    return "conforms"


def exit_status(report: dict) -> int:
    """1 if an implementation does not conform (``fails`` or ``error``), else 0."""
    return 0 if all(i["verdict"] == "conforms" for i in report["implementations"]) else 1


def _describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with status {returncode}"


def _complete(result: dict, order, why: str | None) -> list[dict]:
    """Every property of ``order``: the finished ones as written, the rest ``error``."""
    done = {p["name"]: p for p in result.get("properties", []) if not p.get("running")}
    running = [p["name"] for p in result.get("properties", []) if p.get("running")]
    complete = []
    for name, kind in order:
        if name in done:
            complete.append(done[name])
        elif why is None:
            complete.append({"name": name, "kind": kind, "status": "error",
                             "detail": "not run", "cases": []})
        elif running and name == running[0]:
            complete.append({"name": name, "kind": kind, "status": "error",
                             "detail": f"{why} during this property", "cases": []})
        else:
            during = f" during {running[0]}" if running else \
                f" while {result.get('stage', 'starting')}"
            complete.append({"name": name, "kind": kind, "status": "error",
                             "detail": f"not run: {why}{during}", "cases": []})
    return complete


def _kill(process) -> None:
    """Kill the worker and any children it started (its own process group)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:  # it ended just now
        pass


def _run_one(spec: str, convention, backward, quick: bool, timeout: float,
             folder: Path, index: int) -> dict:
    request = folder / f"request-{index}.json"
    result_path = folder / f"result-{index}.json"
    log = folder / f"output-{index}.txt"
    request.write_text(json.dumps({"spec": spec, "convention": convention,
                                   "backward": backward, "quick": quick}))
    start = time.perf_counter()
    why = None
    with open(log, "wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "attnbench.conformance.worker", str(request),
             str(result_path)], stdout=output, stderr=subprocess.STDOUT,
            start_new_session=True)
        try:
            returncode = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill(process)
            returncode = process.wait()
            why = f"timed out after {timeout:g} s (killed)"
        except BaseException:  # Ctrl-C: its own session would not get the signal
            _kill(process)
            raise
    seconds = round(time.perf_counter() - start, 2)
    try:
        result = json.loads(result_path.read_text())
    except (OSError, ValueError):
        result = {"spec": spec, "name": spec, "convention": convention or "kernels",
                  "stage": "starting"}
    if why is None and not result.get("finished"):
        why = f"the interpreter died ({_describe_exit(returncode)})"
    order = property_order(all_checks(quick=quick))
    if result.get("load_error"):
        why = f"could not load {spec!r}: {result['load_error']}"
        properties = [{"name": n, "kind": k, "status": "error", "detail": why, "cases": []}
                      for n, k in order]
    else:
        properties = _complete(result, order, why)
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
    entry = {"name": result.get("name", spec), "spec": spec,
             "convention": result.get("convention") or convention or "kernels",
             "verdict": "", "properties": properties,
             "capabilities": result.get("capabilities", {}),
             "versions": result.get("versions", {}), "seconds": seconds,
             "returncode": returncode, "problem": why, "output_tail": tail}
    return entry


def conform(specs, *, convention=None, backward=None, quick: bool = False,
            deterministic: bool = False, timeout: float = DEFAULT_TIMEOUT,
            progress=None) -> dict:
    """Run the battery on each implementation, each in its own subprocess.

    Parameters
    ----------
    specs : list of str
        Implementation specs (:mod:`attnbench.conformance.specs`).
    convention : {"kernels", "sdpa", "jax"}, optional
        How to call the ``module:function`` specs (default ``kernels``); named
        implementations keep their own.
    backward : str, optional
        ``module:function`` of a backward for the ``module:function`` specs (``kernels``
        convention; :func:`kernels.attention_backward`'s signature).
    quick : bool
        Skip the speed section.
    deterministic : bool
        Determinism properties decide the verdict too.
    timeout : float
        Seconds per implementation.
    progress : callable, optional
        Called with each implementation's entry as it completes.

    Returns
    -------
    dict
        ``{"implementations": [...], ...}`` as the JSON of ``attnbench conform --json``.
    """
    start = time.perf_counter()
    load_before = load_average()
    entries = []
    with tempfile.TemporaryDirectory(prefix="attnbench-conform-") as folder:
        for index, spec in enumerate(specs):
            mine = ":" in spec  # --convention and --backward are for module:function specs
            entry = _run_one(spec, convention if mine else None, backward if mine else None,
                             quick, timeout, Path(folder), index)
            entry["verdict"] = verdict(entry["properties"], deterministic=deterministic,
                                       problem=entry["problem"])
            entries.append(entry)
            if progress is not None:
                progress(entry)
    return {"implementations": entries, "quick": quick, "deterministic": deterministic,
            "timeout_s": timeout, "seconds": round(time.perf_counter() - start, 2),
            "properties": [{"name": n, "kind": k} for n, k in
                           property_order(all_checks(quick=quick))],
            "machine": {"platform": platform.platform(), "processor": platform.processor(),
                        "cpus": os.cpu_count(), "python": platform.python_version(),
                        "load_average_before": load_before,
                        "load_average_after": load_average()}}

