"""Capabilities found by trying: each feature on a tiny valid problem.

An implementation that refuses a feature (raises ``TypeError``, ``NotImplementedError`` or
``ValueError``, or its convention cannot express it) does not support it: the checks
needing it are ``unsupported``, not failed.  Any other exception is an ``error`` of the
checks needing the feature.
"""

from __future__ import annotations

import numpy as np

from attnbench.conformance.cases import FEATURES, probe_problem

__all__ = ["REFUSALS", "Subject", "describe_exception", "probe"]

#: Exceptions that mean "not supported" when a tiny valid problem raises them.
REFUSALS = (TypeError, NotImplementedError, ValueError)


def describe_exception(exc: BaseException) -> str:
    """``"TypeError: message"``, the message shortened to one line (an exception raised
    again from the worker keeps the worker's description)."""
    if getattr(exc, "description", None):
        return exc.description
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if len(message) > 160:
        message = message[:157] + "..."
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def probe(adapter) -> dict:
    """feature -> ``(state, message)``; state ``supported``, ``unsupported`` or ``error``.

    ``"backward"`` (gradients) is probed last.  ``"plain"`` (no feature) is probed
    first; if even that raises (whatever the exception), every feature is an ``error``:
    an implementation that refuses plain attention supports nothing to check.
    """
    found = {}
    for feature in ("plain", *FEATURES):
        q, k, v, kwargs = probe_problem(feature)
        try:
            adapter.forward(q, k, v, kwargs)
        except REFUSALS as exc:
            found[feature] = ("unsupported", describe_exception(exc))
        except Exception as exc:  # the code under test may raise anything
            found[feature] = ("error", describe_exception(exc))
        else:
            found[feature] = ("supported", "")
        if feature == "plain" and found["plain"][0] != "supported":  # nothing can run
            failed = ("error", f"plain attention raised {found['plain'][1]}")
            return {f: failed for f in ("plain", *FEATURES, "backward")}
    q, k, v, kwargs = probe_problem("plain")
    try:
        adapter.backward(q, k, v, np.ones_like(q), kwargs)
    except REFUSALS as exc:
        found["backward"] = ("unsupported", describe_exception(exc))
    except Exception as exc:
        found["backward"] = ("error", describe_exception(exc))
    else:
        found["backward"] = ("supported", "")
    return found


class Subject:
    """An implementation under test: its adapter and its probed capabilities."""

    def __init__(self, implementation, adapter, capabilities=None):
        self.implementation = implementation
        self.adapter = adapter
        self.capabilities = probe(adapter) if capabilities is None else capabilities

    @property
    def name(self) -> str:
        return self.implementation.name

    def refused(self, needs) -> tuple[str, str] | None:
        """``(state, message)`` of the first needed feature not supported, else None."""
        for feature in sorted(needs):
            state, message = self.capabilities.get(feature, ("supported", ""))
            if state != "supported":
                verb = "refused" if state == "unsupported" else "raised on"
                return state, f"needs {feature}, which it {verb} ({message})"
        return None
