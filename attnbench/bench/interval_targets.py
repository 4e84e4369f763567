"""Targets of the backward and variants sections, each decided from an interval.

A ratio of two timings is the ratio of their medians, with the 95% bootstrap interval of
:func:`attnbench.measure.intervals.ratio_interval` over the samples each row keeps
(``samples_ms``).  A target is *met* when the whole interval is on the goal's side,
*missed* when the whole interval is on the other side, and ``inconclusive`` when the
interval straddles the goal (or there is none: fewer than six samples).  A target over
several shapes is missed if one shape misses, met if all are met, and inconclusive
otherwise.  The goals: the backward pass's speed and memory, the variants' speed.
"""

from __future__ import annotations

import math

import pandas as pd

from attnbench.bench.backward import BACKWARD, FORWARD, MEMORY, TORCH_BACKWARD
from attnbench.measure.intervals import parse_samples, ratio_interval

#: The ``met`` value of a target whose interval straddles its goal.
INCONCLUSIVE = "inconclusive"


def interval_verdict(low: float, high: float, goal: float, *, at_most: bool):
    """True / False / :data:`INCONCLUSIVE` for an interval ``[low, high]`` against ``goal``.

    ``at_most``: the goal is an upper bound (ratio ≤ goal); else a lower bound (≥ goal).
    """
    if math.isnan(low) or math.isnan(high):
        return INCONCLUSIVE
    good, bad = (high <= goal, low > goal) if at_most else (low >= goal, high < goal)
    return True if good else False if bad else INCONCLUSIVE


def combine(verdicts: list):
    """One verdict for several shapes: False if any, True if all, None if none."""
    if not verdicts:
        return None
    if any(v is False for v in verdicts):
        return False
    return True if all(v is True for v in verdicts) else INCONCLUSIVE


def _ratio(num: pd.Series, den: pd.Series) -> tuple[float, float, float]:
    return ratio_interval(parse_samples(num["samples_ms"]), parse_samples(den["samples_ms"]))


def _ratio_target(target: str, shape: str, pairs: list, goal: float, *, at_most: bool,
                  note: str = "") -> dict:
    """A target over ``pairs`` of (label, numerator row, denominator row)."""
    measured, verdicts = [], []
    for label, num, den in pairs:
        ratio, low, high = _ratio(num, den)
        measured.append(f"{label}: {ratio:.2f} [{low:.2f}, {high:.2f}]")
        verdicts.append(interval_verdict(low, high, goal, at_most=at_most))
    met = combine(verdicts)
    return {"target": target, "shape": shape, "measured": ", ".join(measured),
            "goal": f"{'<=' if at_most else '>='} {goal:g}", "met": met,
            "note": note if pairs else (note or "no rows (section not run, or a peer missing)")}


def _find(rows: pd.DataFrame, **where) -> pd.Series | None:
    match = rows
    for column, value in where.items():
        match = match[match[column] == value]
    return match.iloc[0] if len(match) else None


def _at_least(lengths: list, smallest: int) -> tuple[list, str]:
    """The lengths >= ``smallest``, or (a quick run) the largest one, with a note saying so."""
    long = [L for L in lengths if L >= smallest]
    if long or not lengths:
        return long, ""
    return lengths[-1:], f"no L >= {smallest}: at L={lengths[-1]}"


def backward_targets(table: pd.DataFrame, causal_kinds=(False, True)) -> list[dict]:
    """The speed and memory targets of the backward pass."""
    rows = table[(table["section"] == "backward") & (table["status"] == "ok")]
    timed = rows[rows["variant"] != MEMORY]
    lengths = sorted(int(L) for L in timed["L"].unique())

    def pairs_of(lengths, num_where, den_where):
        pairs = []
        for L in lengths:
            for causal in causal_kinds:
                num = _find(timed, L=L, **{"causal": causal, **num_where})
                den = _find(timed, L=L, **{"causal": causal, **den_where})
                if num is not None and den is not None:
                    pairs.append((f"L={L}{' causal' if num['causal'] else ''}", num, den))
        return pairs

    long, note = _at_least(lengths, 1024)
    targets = [_ratio_target(f"backward numba / torch, {'causal' if causal else 'non-causal'}",
                             "B=1 H=12 D=64, out and lse given, every L >= 1024",
                             [pair for pair in pairs_of(long, {"variant": BACKWARD},
                                                        {"variant": TORCH_BACKWARD})
                              if bool(pair[1]["causal"]) == causal],
                             1.0, at_most=True, note=note)
               for causal in causal_kinds]
    if set(causal_kinds) == {False, True}:
        long, note = _at_least(lengths, 2048)
        speedups = [(f"L={L}", den, num) for L in long
                    if (num := _find(timed, L=L, causal=True, variant=BACKWARD)) is not None
                    and (den := _find(timed, L=L, causal=False, variant=BACKWARD)) is not None]
        targets.append(_ratio_target("causal speed-up of the backward", "numba, L >= 2048",
                                     speedups, 1.7, at_most=False, note=note))
    targets.append(_ratio_target("backward / forward time (numba)", "every L, causal and not",
                                 pairs_of(lengths, {"variant": BACKWARD}, {"variant": FORWARD}),
                                 3.0, at_most=True, note="FLOP ratio 2.5"))
    memory = _find(rows, variant=MEMORY)
    if memory is not None:
        targets.append({
            "target": "extra memory of one backward call",
            "shape": f"B=1 H=12 D=64 L={int(memory['L'])}, out and lse given",
            "measured": f"{memory['extra_mib']:.1f} MiB (tracemalloc, gradients excluded); "
                        f"RSS rose {memory['rss_extra_mib']:.1f} MiB",
            "goal": "<= 64 MiB", "met": bool(memory["extra_mib"] <= 64),
            "note": "one call: a measurement, no interval"})
    return targets


#: The variants' goals (issue 21): 8 documents at least this much faster than the plain call,
#: and ALiBi or softcap at most this much slower.
DOCUMENTS_GOAL = 6.5
SCORE_MOD_GOAL = 1.15


def variant_targets(table: pd.DataFrame, config) -> list[dict]:
    """The speed targets of the score and mask functions (``config``: the names)."""
    rows = table[(table["section"] == "variants") & (table["status"] == "ok")]

    def target(name, shape, num_variant, den_variant, goal, at_most):
        num, den = _find(rows, variant=num_variant), _find(rows, variant=den_variant)
        pairs = [] if num is None or den is None else [(f"L={int(num['L'])}", num, den)]
        return _ratio_target(name, shape, pairs, goal, at_most=at_most)

    left, n = config.window_left, config.n_documents
    return [
        target("sliding window speed-up", f"causal, window left={left} vs causal alone",
               "window: causal", f"window: causal + window left={left}", 16, at_most=False),
        target("documents speed-up", f"{n} equal documents vs plain, non-causal",
               "documents: plain", f"documents: {n} documents", DOCUMENTS_GOAL,
               at_most=False),
        target("ALiBi / plain", "non-causal", "scores: alibi", "scores: plain",
               SCORE_MOD_GOAL, at_most=True),
        target("softcap / plain", "non-causal", "scores: softcap", "scores: plain",
               SCORE_MOD_GOAL, at_most=True),
        target("sinks / plain", "non-causal", "scores: sinks", "scores: plain", 1.05,
               at_most=True),
    ]
