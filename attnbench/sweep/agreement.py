"""Every backend against the reference, on a small grid of shapes and masks.

This is what ``attnbench run`` does: for each case of the grid (a shape crossed with
a mask kind) and each dtype, it builds the inputs once, computes the oracle (float64,
or extended precision for float64 inputs) and the tolerance (:mod:`attnbench.measure.oracle`),
then runs each backend through the public :func:`kernels.attention` and records its max
abs error, whether that is within the tolerance, its median time and IQR
(:mod:`attnbench.measure.timing`) and its GFLOP/s (:mod:`attnbench.measure.flops`).  One row per
(case, dtype, backend).

The shapes exercise the tails of the kernels' tiles: odd sizes (L 97 and 113, D 59),
Lq < Lk and Lq > Lk (where a bottom-right causal mask leaves the first queries with no
key at all), a value size Dv != D and grouped-query attention (8 query heads on 2 K/V
heads).  The ``cuda`` backend joins only on a real GPU or when asked by name: Numba's
CUDA simulator runs every GPU thread in Python, far too slowly for these shapes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

import kernels
from attnbench.measure.flops import flops_of_problem, gflops
from attnbench.measure.machine import machine_columns
from attnbench.measure.oracle import max_abs_error, oracle, tolerance
from attnbench.measure.timing import default_probe, fault, measure
from kernels import available_backends, cuda_status, has_real_gpu

__all__ = ["GRIDS", "MASK_KINDS", "Shape", "agreement_table", "make_inputs", "select_backends"]

#: Seed of every random input; case i of the grid uses ``default_rng([SEED, i, mask])``.
SEED = 0
#: Probability that an entry of the random bool mask is True (visible).
BOOL_MASK_DENSITY = 0.7
#: Dropout probability of the "dropout" mask kind.
DROPOUT_P = 0.1
#: Pause (s) before timing each backend: OpenBLAS's workers spin 50-100 ms after a call.
SETTLE_SECONDS = 0.2


@dataclass(frozen=True)
class Shape:
    """The sizes of one attention problem of the grid."""

    name: str
    B: int = 2  # batch; 2, so random key lengths differ between batches
    H: int = 4  # query heads
    Hkv: int | None = None  # key/value heads (None: H); H // Hkv queries share one
    Lq: int = 97  # queries
    Lk: int | None = None  # keys (None: Lq)
    D: int = 64  # head size of q and k
    Dv: int | None = None  # head size of v (None: D)

    def sizes(self) -> dict:
        """``B, H, Hkv, Lq, Lk, D, Dv`` with the defaults filled in."""
        return {
            "B": self.B, "H": self.H, "Hkv": self.Hkv or self.H, "Lq": self.Lq,
            "Lk": self.Lq if self.Lk is None else self.Lk, "D": self.D, "Dv": self.Dv or self.D,
        }


#: Mask kinds, each applied alone: what is passed to kernels.attention.
MASK_KINDS = (
    "none",  # full attention
    "causal",  # causal=True: query i sees keys j <= i
    "bottom-right",  # causal="bottom-right": query i sees keys j <= i + Lk - Lq
    "bool",  # a random (B, H, Lq, Lk) bool mask, BOOL_MASK_DENSITY visible
    "key_lengths",  # random key lengths in [1, Lk] per batch
    "dropout",  # dropout_p=DROPOUT_P with a fixed seed (no mask)
)

#: Named grids of shapes; every shape is crossed with every mask kind and dtype.
GRIDS = {
    "default": (
        Shape("L97", H=4, Lq=97, D=64),
        Shape("L113 D59", H=2, Lq=113, D=59),
        Shape("Lq<Lk", H=4, Lq=64, Lk=113, D=64),
        Shape("Lq>Lk Dv48", H=4, Lq=113, Lk=64, D=64, Dv=48),
        Shape("GQA 8/2", H=8, Hkv=2, Lq=128, D=64),
    ),
    # One small shape with everything odd: for tests and a smoke check (~seconds).
    "tiny": (Shape("tiny GQA 2/1", H=2, Hkv=1, Lq=13, Lk=17, D=8, Dv=5),),
}

DTYPES = (np.float32, np.float64)


def make_inputs(shape: Shape, mask_kind: str, dtype, rng: np.random.Generator):
    """Random ``q, k, v`` of ``shape`` in ``dtype`` and the keyword arguments of ``mask_kind``.

    Values are drawn in float64 and rounded, so both dtypes see the same problem.
    """
    s = shape.sizes()
    q = rng.standard_normal((s["B"], s["H"], s["Lq"], s["D"])).astype(dtype)  # (B, H, Lq, D)
    k = rng.standard_normal((s["B"], s["Hkv"], s["Lk"], s["D"])).astype(dtype)  # (B, Hkv, Lk, D)
    v = rng.standard_normal((s["B"], s["Hkv"], s["Lk"], s["Dv"])).astype(dtype)  # (..., Dv)
    if mask_kind == "none":
        kwargs = {}
    elif mask_kind == "causal":
        kwargs = {"causal": True}
    elif mask_kind == "bottom-right":
        kwargs = {"causal": "bottom-right"}
    elif mask_kind == "bool":
        kwargs = {"mask": rng.random((s["B"], s["H"], s["Lq"], s["Lk"])) < BOOL_MASK_DENSITY}
    elif mask_kind == "key_lengths":
        kwargs = {"key_lengths": rng.integers(1, s["Lk"] + 1, size=s["B"])}
    elif mask_kind == "dropout":
        kwargs = {"dropout_p": DROPOUT_P, "seed": int(rng.integers(2**32))}
    else:
        raise ValueError(f"mask kind {mask_kind!r} is unknown; expected one of {MASK_KINDS}")
    return q, k, v, kwargs


def select_backends(requested=None) -> list[str]:
    """The backends to compare: the available ones, cuda only on a real GPU unless asked.

    Parameters
    ----------
    requested : list of str, optional
        Backend names; each must be available here (``cuda`` then also runs in the
        simulator, if that is what is available).

    Raises
    ------
    ValueError
        A requested backend is unknown or cannot run here.
    """
    available = available_backends()
    if requested is None:
        return [name for name in available if name != "cuda" or has_real_gpu()]
    for name in requested:
        if name not in ("reference", "numba", "cuda"):
            raise ValueError(f"backend {name!r} is unknown; expected reference, numba or cuda")
        if name not in available:
            why = cuda_status()[1] if name == "cuda" else "not available"
            raise ValueError(f"backend {name!r} cannot run here: {why}")
    return list(dict.fromkeys(requested))


@dataclass
class _Case:
    """One (shape, mask kind, dtype) of the grid: inputs, oracle and tolerance."""

    columns: dict  # case, B, H, Hkv, Lq, Lk, D, Dv, mask, dtype
    q: np.ndarray  # (B, H, Lq, D)
    k: np.ndarray  # (B, Hkv, Lk, D)
    v: np.ndarray  # (B, Hkv, Lk, Dv)
    kwargs: dict  # the mask kind's arguments of kernels.attention
    exact: np.ndarray  # (B, H, Lq, Dv), the oracle
    baseline: float  # max abs error of the plain implementation in the input dtype
    tolerance: float
    flops: int

    def call(self, backend: str):
        return kernels.attention(self.q, self.k, self.v, backend=backend, **self.kwargs)


def _build_cases(grid: str, dtypes) -> list[_Case]:
    cases = []
    for case_index, shape in enumerate(GRIDS[grid]):
        for mask_index, mask_kind in enumerate(MASK_KINDS):
            for dtype in map(np.dtype, dtypes):
                rng = np.random.default_rng([SEED, case_index, mask_index])
                q, k, v, kwargs = make_inputs(shape, mask_kind, dtype, rng)
                problem = kernels.prepare(q, k, v, **kwargs)
                exact, plain = oracle(problem)  # (B, H, Lq, Dv) each
                cases.append(_Case(
                    columns={"case": shape.name, **shape.sizes(), "mask": mask_kind,
                             "dtype": dtype.name},
                    q=q, k=k, v=v, kwargs=kwargs, exact=exact,
                    baseline=max_abs_error(plain, exact),
                    tolerance=tolerance(exact, plain, dtype), flops=flops_of_problem(problem),
                ))
    return cases


def _check(case: _Case, backend: str) -> dict:
    """The backend's error on ``case`` (its first call, which also compiles)."""
    try:
        out = case.call(backend)  # (B, H, Lq, Dv)
        error = max_abs_error(out.reshape(case.exact.shape), case.exact)
    except Exception as exc:  # a crashing backend is a failed row, not a crashed run
        return {"max_abs_err": float("nan"), "error": f"{type(exc).__name__}: {exc}"}
    return {"max_abs_err": error, "error": ""}


#: Timing columns beside the median: the interval, the samples taken, the noise flag.
TIMING_EXTRAS = ("ci_low_ms", "ci_high_ms", "samples_taken", "noisy")


def _time(case: _Case, backend: str, max_time: float) -> dict:
    """Median time, IQR and GFLOP/s of the backend on ``case``."""
    timing = measure(lambda: case.call(backend), warmup=1, repeat=7, min_time=1e-3,
                     max_time=max_time, budget=max_time, probe=default_probe())
    return {"median_ms": timing.median * 1e3, "iqr_ms": timing.iqr * 1e3,
            "calls": timing.calls, "gflops": gflops(case.flops, timing.median),
            "ci_low_ms": timing.ci95[0] * 1e3, "ci_high_ms": timing.ci95[1] * 1e3,
            "samples_taken": timing.taken, "noisy": timing.noisy}


def agreement_table(grid: str = "default", *, backends=None, dtypes=DTYPES,
                    max_time: float = 0.05, gemm_peaks: dict | None = None,
                    with_machine: bool = True, settle: float = SETTLE_SECONDS) -> pd.DataFrame:
    """Run every selected backend on every case of ``grid``; one row per (case, dtype, backend).

    Parameters
    ----------
    grid : str, default "default"
        A key of :data:`GRIDS`.
    backends : list of str, optional
        Default: :func:`select_backends` (all available; cuda only on a real GPU).
    dtypes : sequence of dtype, default (float32, float64)
    max_time : float, default 0.05
        Timing budget per (case, dtype, backend), in seconds (see
        :func:`attnbench.measure.timing.measure`); at least 3 timed calls are made.
    gemm_peaks : dict, optional
        ``{"float32": GFLOP/s, ...}`` from :func:`attnbench.measure.machine.gemm_peak_gflops`;
        adds ``gemm_peak_gflops`` (the peak of the row's dtype) and ``pct_of_gemm_peak``.
    with_machine : bool, default True
        Append the :func:`attnbench.measure.machine.machine_columns` to every row.
    settle : float, default SETTLE_SECONDS
        Pause before timing each backend, so that the previous one's threads are idle.

    Returns
    -------
    pandas.DataFrame
        Columns ``case, B, H, Hkv, Lq, Lk, D, Dv, mask, dtype, backend, max_abs_err,
        baseline_err, tolerance, ok, median_ms, iqr_ms, calls, gflops``: the backend's max
        abs error against the oracle (:func:`attnbench.measure.oracle.oracle`), that of the
        plain implementation in the input dtype, the tolerance derived from it, whether
        the backend is within it, its median time and IQR, timed calls and GFLOP/s;
        [``gemm_peak_gflops, pct_of_gemm_peak``], ``error`` (the exception of a backend
        that raised, else empty) and the machine columns.

    Notes
    -----
    All accuracy checks run first; then each backend is timed on every case in turn,
    after a pause of ``settle`` seconds.  Interleaving backends case by case would time
    each one while the previous one's thread pool is still busy-waiting: OpenBLAS's
    workers spin for 50-100 ms after a BLAS call, and on 2 cores that made the numba
    kernel 2.2x slower, with a small IQR that hid it.
    """
    if grid not in GRIDS:
        raise ValueError(f"grid {grid!r} is unknown; expected one of {sorted(GRIDS)}")
    backends = select_backends(backends)
    cases = _build_cases(grid, dtypes)
    results = {(index, name): _check(case, name)
               for index, case in enumerate(cases) for name in backends}
    for name in backends:
        time.sleep(settle)
        for index, case in enumerate(cases):
            if not results[index, name]["error"]:
                results[index, name].update(_time(case, name, max_time))
    rows = []
    for index, case in enumerate(cases):
        for name in backends:
            result = results[index, name]
            row = {**case.columns, "backend": name, "max_abs_err": result["max_abs_err"],
                   "baseline_err": case.baseline, "tolerance": case.tolerance,
                   "ok": not result["error"] and result["max_abs_err"] <= case.tolerance,
                   "median_ms": result.get("median_ms", float("nan")),
                   "iqr_ms": result.get("iqr_ms", float("nan")),
                   "calls": result.get("calls", 0),
                   "gflops": result.get("gflops", float("nan")),
                   **{key: result[key] for key in TIMING_EXTRAS if key in result}}
            if gemm_peaks is not None:
                peak = gemm_peaks.get(case.columns["dtype"], float("nan"))
                row["gemm_peak_gflops"] = peak
                pct = 100 * row["gflops"] / peak
                row["fault"] = fault(pct, 100, "% of the GEMM peak")
                row["pct_of_gemm_peak"] = float("nan") if row["fault"] else pct
            row["error"] = result["error"]
            rows.append(row)
    table = pd.DataFrame(rows)
    if with_machine:
        for column, value in machine_columns().items():
            table[column] = value
    return table
