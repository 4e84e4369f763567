"""The worker: the process of the code under test, which only calls it.

``python -m attnbench.conformance.worker IN OUT`` reads requests from file descriptor IN
and answers on OUT (:mod:`attnbench.conformance.wire`: plain data and number arrays).
It imports the implementation, calls it on the inputs the judge sends and sends back its
outputs as bytes; it never computes an expected output, judges a result or reads a clock
for the report.  The judge (:mod:`attnbench.conformance.remote`, in the parent) draws the
problems, computes the oracle, compares and times, so an implementation cannot see the
answer it is compared with, patch the comparison or the timer, or hand back an object
that runs code when it is read.

Requests (``{"op": ...}``):

- ``load`` (``spec``, ``convention``, ``backward``): resolve and adapt the implementation;
  the answer is its name, convention and versions, or the load error.
- ``call`` (``method``, ``args``): one adapter call (``forward``, ``forward_watched``,
  ``forward_in_place``, ``forward_lse``, ``backward``, ``native_causal``, ``dropout``;
  the adapter keeps the last watched outputs alive here, where reuse can be seen); the
  answer is its
  result, or the exception it raised (its type, description, and whether it is a refusal).
- ``threads`` (``n``): the calls that follow run on ``n`` threads (None: as at start).
- ``stage`` (``who``: ``impl`` or ``numba``, ``args``) and ``run`` (``handle``): a call
  prepared once and then run on a request of a few bytes, so that the judge's clock
  around ``run`` times the call and little else.
- ``versions``, ``exit``.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import traceback

__all__ = ["main", "versions"]


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


class _Server:
    """The implementation, its adapter, the thread limit in force and the staged calls."""

    def __init__(self):
        self.implementation = self.adapter = None
        self.threads = contextlib.ExitStack()
        self.staged: list = []

    def load(self, spec, convention, backward) -> dict:
        from attnbench.conformance.capabilities import describe_exception
        from attnbench.measure.adapters import make_adapter
        from attnbench.measure.specs import resolve

        try:
            self.implementation = resolve(spec, convention, backward)
            self.adapter = make_adapter(self.implementation)
        except Exception as exc:  # an import error of the code under test, a missing peer
            return {"load_error": describe_exception(exc),
                    "traceback": traceback.format_exc(limit=3)}
        return {"name": self.implementation.name,
                "convention": self.implementation.convention,
                "versions": versions(self.implementation)}

    def call(self, method: str, args: list):
        result = getattr(self.adapter, method)(*args)
        if method == "forward_watched":
            return {"output": result.output, "changed": result.changed,
                    "aliased": result.aliased, "reused": result.reused,
                    "earlier_changed": result.earlier_changed}
        return result

    def limit(self, n) -> None:
        from attnbench.measure.problems import limit_threads

        self.threads.close()
        self.threads = contextlib.ExitStack()
        if n is not None:
            self.threads.enter_context(limit_threads(n, torch=True))

    def stage(self, who: str, args: list) -> int:
        from attnbench import kernels

        q, k, v, kwargs = args
        if who == "numba":
            call = functools.partial(kernels.attention, q, k, v, backend="numba", **kwargs)
        else:  # the adapter's conversion (a copy of the inputs) is inside, as in a user's call
            call = functools.partial(self.adapter.forward, q, k, v, kwargs)
        self.staged.append(call)
        return len(self.staged) - 1

    def answer(self, request: dict):
        op = request["op"]
        if op == "load":
            return self.load(request["spec"], request.get("convention"),
                             request.get("backward"))
        if op == "call":
            return self.call(request["method"], request["args"])
        if op == "threads":
            return self.limit(request["n"])
        if op == "stage":
            return self.stage(request["who"], request["args"])
        if op == "run":
            self.staged[request["handle"]]()
            return None
        if op == "versions":
            return versions(self.implementation) if self.implementation else {}
        raise ValueError(f"unknown request {op!r}")


def _raised(exc: BaseException) -> dict:
    from attnbench.conformance.capabilities import REFUSALS, describe_exception

    kind = next((t.__name__ for t in REFUSALS if isinstance(exc, t)), None)
    return {"raised": {"type": type(exc).__name__, "refusal": kind,
                       "description": describe_exception(exc)}}


def main(argv=None) -> int:
    """Answer requests until ``exit`` or until the judge closes the pipe."""
    from attnbench.conformance import wire

    incoming, outgoing = (int(fd) for fd in (argv or sys.argv[1:]))
    server = _Server()
    while True:
        try:
            request = wire.receive(incoming)
        except wire.Closed:
            return 0
        if request["op"] == "exit":
            wire.send(outgoing, {"ok": None})
            return 0
        try:
            reply = wire.encode({"ok": server.answer(request)})  # raises on an output that
            # is not plain numbers
        except Exception as exc:  # the code under test may raise anything
            reply = wire.encode(_raised(exc))
        wire.send_encoded(outgoing, reply)


if __name__ == "__main__":
    sys.exit(main())
