"""The worker: runs the battery on one implementation, in its own process.

``python -m attnbench.conformance.worker REQUEST RESULT`` reads the request (JSON:
``spec``, ``convention``, ``backward``, ``quick``), imports the implementation, probes it
and runs the battery, rewriting RESULT (JSON) after every property, so that whatever
happens later (a hang the runner kills, a crash of the interpreter) the finished
properties are kept and the one under way is known.  The runner
(:mod:`attnbench.conformance.runner`) never imports the code under test itself.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

__all__ = ["main", "versions"]


def _write(path: Path, result: dict) -> None:
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(result, default=_plain))
    os.replace(partial, path)  # atomic: the runner never reads half a file


def _plain(value):
    """JSON for NumPy scalars and arrays, and anything else as its repr."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return repr(value)


def versions(implementation) -> dict:
    """Versions of the implementation's top-level package and of torch and jax if loaded."""
    found = {}
    module = getattr(getattr(implementation.function, "func", implementation.function),
                     "__module__", None) or ""
    for name in {module.split(".")[0], "torch", "jax", "numpy"} - {""}:
        loaded = sys.modules.get(name)
        if loaded is not None and getattr(loaded, "__version__", None):
            found[name] = str(loaded.__version__)
    return found


def main(argv=None) -> int:
    """Run one request; the exit status is 0 whenever RESULT was written to the end."""
    request_path, result_path = (Path(p) for p in (argv or sys.argv[1:]))
    request = json.loads(request_path.read_text())
    result = {"spec": request["spec"], "name": request["spec"],
              "convention": request.get("convention") or "kernels", "properties": [],
              "stage": "loading", "finished": False}
    _write(result_path, result)
    start = time.perf_counter()
    from attnbench.conformance.adapters import make_adapter
    from attnbench.conformance.battery import all_checks, run_checks
    from attnbench.conformance.capabilities import Subject, describe_exception
    from attnbench.conformance.specs import resolve

    try:
        implementation = resolve(request["spec"], request.get("convention"),
                                 request.get("backward"))
        adapter = make_adapter(implementation)
    except Exception as exc:  # an import error of the code under test, a missing peer
        result.update(stage="load", load_error=describe_exception(exc),
                      traceback=traceback.format_exc(limit=3), finished=True)
        _write(result_path, result)
        return 0
    result.update(name=implementation.name, convention=implementation.convention,
                  stage="probing", versions=versions(implementation))
    _write(result_path, result)
    subject = Subject(implementation, adapter)
    result.update(capabilities={k: list(v) for k, v in subject.capabilities.items()},
                  stage="battery", versions=versions(implementation))
    _write(result_path, result)

    def on_property(summary):
        done = [p for p in result["properties"] if not p.get("running")]
        result["properties"] = done + [summary]
        result["seconds"] = round(time.perf_counter() - start, 2)
        _write(result_path, result)

    run_checks(subject, all_checks(quick=request.get("quick", False)), on_property)
    result.update(stage="done", finished=True, seconds=round(time.perf_counter() - start, 2))
    _write(result_path, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
