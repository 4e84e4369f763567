"""Argument types shared by the subcommands (argparse ``type=`` functions)."""

from __future__ import annotations

import argparse

from attnbench.sweep.cluster import parse_cluster
from attnbench.sweep.grid import check_variant

__all__ = ["backend_name", "cluster_spec", "peer_name", "positive_int", "variant"]


def positive_int(text: str) -> int:
    """An argparse type: an integer ≥ 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def variant(text: str) -> str:
    """An argparse type: a sweep variant (see :func:`attnbench.sweep.grid.check_variant`)."""
    try:
        return check_variant(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def backend_name(text: str) -> str:
    """An argparse type: a sweep backend (:data:`~attnbench.sweep.grid.BACKENDS`) or an
    implementation spec (``module:function``, a registered ``attnbench.implementations``
    name)."""
    from attnbench.measure.peers import is_external
    from attnbench.sweep.grid import BACKENDS

    if text in BACKENDS or is_external(text):
        return text
    raise argparse.ArgumentTypeError(  # argparse's own words for a bad choice
        f"invalid choice: {text!r} (choose from {', '.join(BACKENDS)}, a name another "
        "package registered under attnbench.implementations, or module:function)")


def peer_name(text: str) -> str:
    """An argparse type: a bench peer, ``torch``, ``numpy`` or an implementation spec."""
    from attnbench.measure.peers import PEERS, is_external

    if text in PEERS or is_external(text):
        return text
    raise argparse.ArgumentTypeError(
        f"invalid choice: {text!r} (choose from torch, numpy, a name another package "
        "registered under attnbench.implementations, or module:function)")


def cluster_spec(text: str):
    """An argparse type: a ``--cluster`` value (:func:`~attnbench.sweep.cluster.parse_cluster`)."""
    try:
        return parse_cluster(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
