"""Argument types shared by the subcommands (argparse ``type=`` functions)."""

from __future__ import annotations

import argparse

from attnbench.sweep.cluster import parse_cluster
from attnbench.sweep.grid import check_variant

__all__ = ["cluster_spec", "positive_int", "variant"]


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


def cluster_spec(text: str):
    """An argparse type: a ``--cluster`` value (:func:`~attnbench.sweep.cluster.parse_cluster`)."""
    try:
        return parse_cluster(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
