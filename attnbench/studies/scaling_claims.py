"""The exponents the scaling claims expect, per quantity, variable, backend and point kind.

Time is claimed to grow as L² against L and linearly in d_k, heads and batch
(:data:`TIME_EXPONENTS`).  Memory against L: at most linear for the fused numba kernel,
quadratic for the backends that build the L x L scores (:data:`MEMORY_EXPONENTS`).  A
backward pass has the same claims; its series are fitted apart from the forward's.

Decode and varlen points (the sweep's ``kind``, :mod:`attnbench.sweep.kinds`) are series
of their own: a decode step's time and memory against its cache length (L, named Lk in
the verdicts) are expected O(Lk) (one query row per sequence: every key and value read
once); a packed batch of sequences L, L/2, ... is expected O(L²) against L and has no
claim against its batch (each added sequence is half the last).

A causal sliding window of fixed W costs O(L·W) to the backends that skip the tiles a
mask hides (:data:`SKIPPING_BACKENDS`), so their time against L at fixed W is expected
linear; the others compute every pair whatever the window.

:func:`expected_exponent` answers for one series; :mod:`attnbench.studies.scaling` fits
the series and :mod:`attnbench.studies.scaling_verdicts` holds each fit against the
answer.  Kept apart from both so that what is claimed can be read, and changed, in one
place.
"""

from __future__ import annotations

from attnbench.measure.implementations import names

__all__ = ["MEMORY_EXPONENTS", "SKIPPING_BACKENDS", "TIME_EXPONENTS", "expected_exponent"]

#: Variables fitted against, with the expected exponent of the time.
TIME_EXPONENTS = {"L": 2, "d_k": 1, "heads": 1, "batch": 1}
#: Expected exponent of the peak memory against L, per backend (None: no claim), and
#: whether it is an upper bound.  The fused kernel promises O(L·D) working memory (no
#: L x L array): at most linear; its fixed per-thread buffers make the slope lower at
#: small L.  The reference and the plain NumPy peer build the L x L scores: quadratic.
MEMORY_EXPONENTS = {"numba": (1, True), "reference": (2, False), "numpy": (2, False)}
#: Backends that skip the key tiles a mask function hides (kernels.mods block sparsity):
#: a sliding window costs them O(L·W).  The others (the reference, the peers given a
#: dense mask) compute every pair: O(L²) whatever the window.
SKIPPING_BACKENDS = names(skips_hidden_tiles=True)


def expected_exponent(quantity: str, variable: str, backend: str,
                      variant: str = "none", kind: str = "dense") -> tuple[float | None, bool]:
    """``(expected exponent or None, whether it is an upper bound)`` of ``quantity``
    (time, cpu, memory, flops) against ``variable`` for a series of ``backend`` points of
    that variant and kind; None where nothing is claimed."""
    if kind == "decode":  # one query row per sequence: the work and the memory are O(Lk)
        return (1, quantity == "memory") if variable == "L" else (
            (None, False) if quantity == "memory" else (TIME_EXPONENTS[variable], False))
    if kind == "varlen" and variable == "batch":  # more sequences, each half the last
        return None, False
    if quantity == "memory":
        return MEMORY_EXPONENTS.get(backend, (None, False)) if variable == "L" else (None, False)
    if variable == "L" and str(variant).startswith("window-") and backend in SKIPPING_BACKENDS:
        return 1, False  # a fixed window skipped tile by tile: O(L·W) work, linear in L
    return TIME_EXPONENTS[variable], False
