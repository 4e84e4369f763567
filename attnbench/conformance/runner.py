"""The runner: the judge of each implementation, whose calls run in a worker process.

:func:`conform` draws the run's seed (or takes ``seed``), then for each implementation
starts a worker (:class:`~attnbench.conformance.remote.RemoteAdapter`: the code under test
in its own process, which only calls it) and runs the battery here, where the problems
are drawn, the oracle computed, the outputs compared and the calls timed.  Everything
the worker does shares one time limit.  An implementation that raises is reported per
check (``error``, with the exception); one that hangs is killed and reported ``timed out
after S s during <property>``; one that kills its interpreter (``os._exit``, a segfault)
is reported with its exit status or signal; in both cases the properties it finished
keep their results, and the other implementations still run.
"""

from __future__ import annotations

import os
import platform
import secrets
import tempfile
import time
from pathlib import Path

from attnbench.conformance.battery import all_checks, property_order, run_checks
from attnbench.conformance.capabilities import Subject
from attnbench.conformance.remote import RemoteAdapter, WorkerGone
from attnbench.measure.implementation import Implementation
from attnbench.measure.problems import load_average

__all__ = ["DEFAULT_TIMEOUT", "conform", "exit_status", "new_seed", "verdict"]

#: Seconds one implementation may take, battery and speed section included.
DEFAULT_TIMEOUT = 600.0


def new_seed() -> int:
    """A seed for a run's problems, new each time (32 bits: short enough to type)."""
    return secrets.randbelow(2**32)


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


def _battery(adapter: RemoteAdapter, spec: str, convention, backward, checks,
             result: dict) -> None:
    """Load ``spec`` (with ``convention`` and ``backward``), probe it and run ``checks``
    through ``adapter``, noting progress in ``result``."""
    result["stage"] = "loading"
    loaded = adapter.load(spec, convention, backward)
    if "load_error" in loaded:
        result.update(loaded, finished=True)
        return
    result.update(name=loaded["name"], convention=loaded["convention"],
                  versions=loaded["versions"], stage="probing")
    subject = Subject(Implementation(None, loaded["convention"], None, loaded["name"], spec),
                      adapter)
    result.update(capabilities={k: list(v) for k, v in subject.capabilities.items()},
                  stage="battery")

    def on_property(summary):
        done = [p for p in result["properties"] if not p.get("running")]
        result["properties"] = done + [summary]

    run_checks(subject, checks, on_property)
    result.update(versions=adapter.ask("versions"), stage="done", finished=True)


def _run_one(spec: str, convention, backward, quick: bool, seed: int, timeout: float,
             log: Path) -> dict:
    checks = all_checks(quick=quick, seed=seed)
    result = {"name": spec, "convention": convention or "kernels", "properties": [],
              "stage": "starting"}
    start = time.perf_counter()
    why = None
    adapter = RemoteAdapter(timeout=timeout, log=log)
    try:
        _battery(adapter, spec, convention, backward, checks, result)
    except WorkerGone as exc:
        why = str(exc)
    except BaseException:  # Ctrl-C: the worker's own session would not get the signal
        adapter.kill()
        adapter.close()
        raise
    returncode = adapter.close()
    order = property_order(checks)
    if result.get("load_error"):
        why = f"could not load {spec!r}: {result['load_error']}"
        properties = [{"name": n, "kind": k, "status": "error", "detail": why, "cases": []}
                      for n, k in order]
    else:
        properties = _complete(result, order, why)
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
    return {"name": result["name"], "spec": spec, "convention": result["convention"],
            "verdict": "", "properties": properties,
            "capabilities": result.get("capabilities", {}),
            "versions": result.get("versions", {}),
            "seconds": round(time.perf_counter() - start, 2),
            "returncode": returncode, "problem": why, "output_tail": tail}


def conform(specs, *, convention=None, backward=None, quick: bool = False,
            deterministic: bool = False, timeout: float = DEFAULT_TIMEOUT,
            seed: int | None = None, progress=None) -> dict:
    """Run the battery on each implementation, each in its own subprocess.

    Parameters
    ----------
    specs : list of str
        Implementation specs (:mod:`attnbench.measure.specs`).
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
    seed : int, optional
        The seed of the run's problems (:func:`attnbench.conformance.cases.drawn_cases`
        and every check's values); a new one (:func:`new_seed`) if None.  The same seed
        gives the same problems, so a run is replayed with the seed its JSON records.
    progress : callable, optional
        Called with each implementation's entry as it completes.

    Returns
    -------
    dict
        ``{"implementations": [...], ...}`` as the JSON of ``attnbench conform --json``.
    """
    start = time.perf_counter()
    load_before = load_average()
    seed = new_seed() if seed is None else int(seed)
    entries = []
    with tempfile.TemporaryDirectory(prefix="attnbench-conform-") as folder:
        for index, spec in enumerate(specs):
            mine = ":" in spec  # --convention and --backward are for module:function specs
            entry = _run_one(spec, convention if mine else None, backward if mine else None,
                             quick, seed, timeout, Path(folder) / f"output-{index}.txt")
            entry["verdict"] = verdict(entry["properties"], deterministic=deterministic,
                                       problem=entry["problem"])
            entries.append(entry)
            if progress is not None:
                progress(entry)
    return {"implementations": entries, "seed": seed, "quick": quick,
            "deterministic": deterministic, "timeout_s": timeout,
            "seconds": round(time.perf_counter() - start, 2),
            "properties": [{"name": n, "kind": k} for n, k in
                           property_order(all_checks(quick=quick))],
            "machine": {"platform": platform.platform(), "processor": platform.processor(),
                        "cpus": os.cpu_count(), "python": platform.python_version(),
                        "load_average_before": load_before,
                        "load_average_after": load_average()}}

