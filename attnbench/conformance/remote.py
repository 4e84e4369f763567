"""The judge's side of the process boundary: an adapter whose calls run in the worker.

:class:`RemoteAdapter` starts :mod:`attnbench.conformance.worker` (its own session, so a
hang is killed with its children; its output to a log file) and offers the battery the
same calls as an in-process adapter (:mod:`attnbench.measure.adapters`).  The
battery runs here, in the judge: the problems are drawn, the oracle computed and the
outputs compared in this process, and the speed section's clock is this process's,
around a request of a few bytes.  The outputs arrive as plain number arrays
(:mod:`attnbench.conformance.wire`).

An exception the implementation raised arrives as its type and description: the
refusals (``TypeError``, ``NotImplementedError``, ``ValueError``) are raised again as
such, anything else as :class:`RaisedInWorker`; each carries the worker's description
(``description``: its own type's name and message).  A worker that runs past the deadline is
killed; one that exits raises :class:`WorkerGone` either way, naming what happened.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time

from attnbench.conformance import wire
from attnbench.conformance.capabilities import REFUSALS
from attnbench.measure.adapters import Watched

__all__ = ["RaisedInWorker", "RemoteAdapter", "WorkerGone", "describe_exit"]

#: The refusals by the name the worker gives them (the first of them the exception is).
_REFUSALS = {kind.__name__: kind for kind in REFUSALS}


class WorkerGone(BaseException):
    """The worker timed out (and was killed) or exited; ``str()`` says which.

    A :class:`BaseException`, as :class:`KeyboardInterrupt` is: the battery catches
    ``Exception`` from the code under test per check, and a worker that is gone ends the
    battery instead (the runner reports the property under way and those not run)."""


class RaisedInWorker(Exception):
    """An exception of the implementation other than a refusal; its ``description`` is
    ``"Type: message"`` as the worker saw it."""


def describe_exit(returncode: int) -> str:
    """``"exited with status N"`` or ``"killed by signal NAME"``."""
    if returncode < 0:
        try:
            return f"killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with status {returncode}"


class RemoteAdapter:
    """The implementation behind ``spec``, called in a worker process.

    Parameters
    ----------
    timeout : float
        Seconds from the start for everything the worker does; past them it is killed.
    log : path
        Where the worker's standard output and error go.
    """

    def __init__(self, *, timeout: float, log):
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.convention = "kernels"
        to_worker, self._to_worker = os.pipe()
        self._from_worker, from_worker = os.pipe()
        self._log = open(log, "wb")  # noqa: SIM115 (closed in close())
        self.process = subprocess.Popen(
            [sys.executable, "-m", "attnbench.conformance.worker", str(to_worker),
             str(from_worker)], stdout=self._log, stderr=subprocess.STDOUT,
            pass_fds=(to_worker, from_worker), start_new_session=True)
        os.close(to_worker)
        os.close(from_worker)

    # --- the requests ------------------------------------------------------------------

    def _wait(self, fd: int) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            self.kill()
            raise WorkerGone(f"timed out after {self.timeout:g} s (killed)")

    def _gone(self) -> WorkerGone:
        try:
            returncode = self.process.wait(timeout=max(1.0, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
            returncode = self.process.wait()
        return WorkerGone(f"the interpreter died ({describe_exit(returncode)})")

    def ask(self, op: str, **fields):
        """Send one request; its answer, or the implementation's exception raised here."""
        try:
            wire.send(self._to_worker, {"op": op, **fields})
            reply = wire.receive(self._from_worker, self._wait)
        except (wire.Closed, BrokenPipeError):
            raise self._gone() from None
        if "raised" in reply:
            raised = reply["raised"]
            kind = _REFUSALS.get(raised["refusal"], RaisedInWorker)
            exc = kind(raised["description"].split(": ", 1)[-1])
            exc.description = raised["description"]  # the type name the worker saw
            raise exc
        return reply["ok"]

    def load(self, spec: str, convention=None, backward=None) -> dict:
        """Load the implementation: ``{name, convention, versions}`` or ``{load_error}``."""
        loaded = self.ask("load", spec=spec, convention=convention, backward=backward)
        self.convention = loaded.get("convention", self.convention)
        return loaded

    # --- an adapter's calls ------------------------------------------------------------

    def forward(self, q, k, v, kwargs):
        return self.ask("call", method="forward", args=[q, k, v, kwargs])

    def forward_watched(self, q, k, v, kwargs) -> Watched:
        found = self.ask("call", method="forward_watched", args=[q, k, v, kwargs])
        return Watched(found["output"], found["changed"], found["aliased"], found["reused"],
                       found["earlier_changed"])

    def forward_in_place(self, q, k, v, kwargs, q2, k2, v2):
        return tuple(self.ask("call", method="forward_in_place",
                              args=[q, k, v, kwargs, q2, k2, v2]))

    def forward_lse(self, q, k, v, kwargs):
        return tuple(self.ask("call", method="forward_lse", args=[q, k, v, kwargs]))

    def backward(self, q, k, v, dout, kwargs):
        return tuple(self.ask("call", method="backward", args=[q, k, v, dout, kwargs]))

    def native_causal(self, q, k, v):
        return self.ask("call", method="native_causal", args=[q, k, v])

    def dropout(self, q, k, v, p, seed):
        return self.ask("call", method="dropout", args=[q, k, v, p, seed])

    @contextlib.contextmanager
    def threads(self, n: int):
        """The worker's calls run on ``n`` threads inside the context."""
        self.ask("threads", n=n)
        try:
            yield
        finally:
            self.ask("threads", n=None)

    def timed_calls(self, q, k, v, kwargs) -> dict:
        """``{"impl": f, "numba": g}``: each runs one call in the worker, on inputs staged
        there once, for a request and an answer of a few bytes each; both carry the same
        round trip."""
        calls = {}
        for who in ("impl", "numba"):
            handle = self.ask("stage", who=who, args=[q, k, v, kwargs])
            calls[who] = lambda handle=handle: self.ask("run", handle=handle)
        return calls

    # --- the end -----------------------------------------------------------------------

    def kill(self) -> None:
        """Kill the worker and any children it started (its own process group)."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:  # it ended just now
            pass

    def close(self) -> int:
        """Ask the worker to exit (kill it if it does not); its exit status."""
        if self.process.poll() is None:
            with contextlib.suppress(WorkerGone, OSError):
                self.ask("exit")
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        returncode = self.process.wait()
        for fd in (self._to_worker, self._from_worker):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._log.close()
        return returncode
