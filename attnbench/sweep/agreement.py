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
heads).  These shapes have no equivalent among the sweep's grids (a sweep point has
Lq = Lk = L and Dv = D), so they are named here (:data:`GRIDS`); the dtypes are the
sweep's (:data:`attnbench.sweep.grid.DTYPES`, those this machine can make) and the
backends are the registry's (:mod:`attnbench.measure.implementations`: every ``backend``
kernels can run here).  A GPU backend joins only on a real GPU or when asked by name:
Numba's CUDA simulator runs every GPU thread in Python, far too slowly for these shapes.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from attnbench import kernels
from attnbench.kernels import available_backends, cuda_status, has_real_gpu
from attnbench.kernels._dtypes import as_dtype, bfloat16_dtype, is_half
from attnbench.measure import problems
from attnbench.measure.flops import flops_of_problem, gflops
from attnbench.measure.implementations import names
from attnbench.measure.machine import (
    busy_machine,
    gemm_peak_gflops,
    machine_columns,
    machine_record,
    summary_lines,
)
from attnbench.measure.oracle import max_abs_error, oracle, tolerance
from attnbench.measure.problems import (
    SETTLE_SECONDS,
    ProblemSpec,
    load_average,
    make_inputs,
    timing_threads,
)
from attnbench.measure.timing import default_probe, fault, measure
from attnbench.sweep import grid as sweep_grid

__all__ = ["GRIDS", "MASK_KINDS", "agreement_table", "run_agreement", "select_backends"]

#: The mask kinds every case is crossed with: all of them (see measure.problems).
MASK_KINDS = problems.MASK_KINDS


def _shape(name: str, **sizes) -> ProblemSpec:
    """A case of the grid: B=2 (so random key lengths differ between batches), H=4."""
    return ProblemSpec(name, **{"B": 2, "H": 4, **sizes})


#: Named grids of shapes; every shape is crossed with every mask kind and dtype.  Lq != Lk
#: and Dv != D, which a sweep's grid cannot express, are the point of most of them.
GRIDS = {
    "default": (
        _shape("L97", Lq=97, D=64),
        _shape("L113 D59", H=2, Lq=113, D=59),
        _shape("Lq<Lk", Lq=64, Lk=113, D=64),
        _shape("Lq>Lk Dv48", Lq=113, Lk=64, D=64, Dv=48),
        _shape("GQA 8/2", H=8, Hkv=2, Lq=128, D=64),
    ),
    # One small shape with everything odd: for tests and a smoke check (~seconds).
    "tiny": (_shape("tiny GQA 2/1", H=2, Hkv=1, Lq=13, Lk=17, D=8, Dv=5),),
}

#: The sweep's dtypes (:data:`attnbench.sweep.grid.DTYPES`) that NumPy can make here:
#: bfloat16 needs ml_dtypes.  The half dtypes are computed in float32 and judged by the
#: half rule (:mod:`attnbench.measure.oracle`).
DTYPES = tuple(as_dtype(name) for name in sweep_grid.DTYPES
               if name != "bfloat16" or bfloat16_dtype() is not None)


def select_backends(requested=None) -> list[str]:
    """The backends to compare: the registry's that kernels can run here
    (:func:`kernels.available_backends`, in its order), a GPU one only on a real GPU
    unless asked.

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
    known, gpu = names(kind="backend"), names(kind="backend", device="gpu")
    if requested is None:
        return [name for name in available
                if name in known and (name not in gpu or has_real_gpu())]
    for name in requested:
        if name not in known:
            raise ValueError(f"backend {name!r} is unknown; expected one of "
                             f"{', '.join(known)}")
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
                spec = shape.with_mask_kind(mask_kind)
                q, k, v, kwargs = make_inputs(spec, dtype, seed=case_index * 100 + mask_index)
                problem = kernels.prepare(q, k, v, **kwargs)
                exact, plain = oracle(problem)  # (B, H, Lq, Dv) each
                sizes = dict(zip(("B", "H", "Hkv", "Lq", "Lk", "D", "Dv"), shape.sizes,
                                 strict=True))
                cases.append(_Case(
                    columns={"case": shape.name, **sizes, "mask": mask_kind,
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
    """Median time, IQR and GFLOP/s of the backend on ``case`` (the reference with the BLAS
    on one thread, as a sweep times it: :func:`attnbench.measure.problems.timing_threads`)."""
    with timing_threads(backend):
        timing = measure(lambda: case.call(backend), warmup=1, repeat=7, min_time=1e-3,
                         max_time=max_time, budget=max_time, probe=default_probe())
    extras = timing.row_columns()
    return {**timing.ms_columns(), "gflops": gflops(case.flops, timing.median),
            **{name: extras[name] for name in TIMING_EXTRAS}}


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
    dtypes : sequence of dtype, default (float32, float64, float16, bfloat16)
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
    workers spin for a while after a BLAS call, and on 2 cores that makes the numba
    kernel about twice as slow, with a small IQR that hides it.
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


#: Columns of the console table, with their headers.
DISPLAY_COLUMNS = {
    "case": "case", "B": "B", "H": "H", "Hkv": "Hkv", "Lq": "Lq", "Lk": "Lk", "D": "D",
    "Dv": "Dv", "mask": "mask", "dtype": "dtype", "backend": "backend",
    "max_abs_err": "max|err|", "tolerance": "tol", "ok": "agree",
    "median_ms": "median ms", "iqr_ms": "IQR ms", "gflops": "GFLOP/s",
    "pct_of_gemm_peak": "% GEMM",
}


def format_table(table: pd.DataFrame) -> str:
    """The agreement table as readable fixed-width text."""
    shown = table[[column for column in DISPLAY_COLUMNS if column in table]].copy()
    shown["ok"] = shown["ok"].map({True: "yes", False: "NO"})
    formatters = {
        "max_abs_err": "{:.2e}".format, "tolerance": "{:.2e}".format,
        "median_ms": "{:.3f}".format, "iqr_ms": "{:.3f}".format,
        "gflops": "{:.2f}".format, "pct_of_gemm_peak": "{:.1f}".format,
    }
    shown = shown.rename(columns=DISPLAY_COLUMNS)
    formatters = {DISPLAY_COLUMNS[key]: value for key, value in formatters.items()}
    return shown.to_string(index=False, formatters=formatters)


def run_agreement(out: Path, *, grid: str = "default", backends=None,
                  max_time: float = 0.05) -> tuple[int, dict, float]:
    """``attnbench run``'s first step: the machine record, the GEMM peaks and the table.

    Prints the machine summary and the table, writes ``out/agreement.csv`` and
    ``out/machine.json``.

    Returns
    -------
    status : int
        0 if every backend agrees everywhere, 1 if not, 2 if ``backends`` cannot run here.
    gemm_peaks : dict
        ``{"float32": GFLOP/s, "float64": GFLOP/s}`` measured here.
    started : float
        ``time.perf_counter()`` at the start.
    """
    start = time.perf_counter()
    load_1m = load_average()
    try:
        backends = select_backends(backends)
    except ValueError as exc:
        print(f"attnbench run: error: {exc}", file=sys.stderr)
        return 2, {}, start
    peaks = {np.dtype(dtype).name: gemm_peak_gflops(dtype) for dtype in (np.float32, np.float64)}
    # Half precision is computed in float32: float32's peak is the one it is held to.
    peaks_by_dtype = {**peaks, **{d.name: peaks["float32"] for d in DTYPES if is_half(d)}}
    record = machine_record()  # after the peak probes, which it lists
    lines = summary_lines(record)
    lines.append("GEMM peak  " + ", ".join(f"{name} {peak:.1f} GFLOP/s (numpy matmul, n=1024)"
                                             for name, peak in peaks.items()))
    busy = busy_machine(load_1m, record["usable_cores"] or record["logical_cores"])
    lines.append(f"Load       {load_1m:.2f} (1-min average before the run)" + (
        ": the machine was busy, timings may be noisy" if busy else ""))
    print("\n".join(lines))
    n_shapes = len(GRIDS[grid])
    print(f"\nGrid '{grid}': {n_shapes} shape{'s' * (n_shapes != 1)} x "
          f"{len(MASK_KINDS)} mask kinds x {len(DTYPES)} dtypes, backends {', '.join(backends)}",
          flush=True)
    print(flush=True)

    table = agreement_table(grid, backends=backends, max_time=max_time, gemm_peaks=peaks_by_dtype)
    print(format_table(table))
    failed = table[~table["ok"]]
    for row in failed[failed["error"] != ""].itertuples():
        print(f"\n{row.backend} on {row.case} / {row.mask} / {row.dtype} raised: {row.error}")
    out.mkdir(parents=True, exist_ok=True)
    csv_path = out / "agreement.csv"
    table.to_csv(csv_path, index=False)
    elapsed = time.perf_counter() - start
    machine_path = out / "machine.json"
    machine_path.write_text(json.dumps(
        {**record, "gemm_peak_gflops": peaks, "load_average_1m": load_1m,
         "run_seconds": elapsed}, indent=2) + "\n")
    print(f"\n{len(table) - len(failed)}/{len(table)} rows agree with the reference. "
          f"Wrote {csv_path} and {machine_path} in {elapsed:.1f} s.")
    return (0 if failed.empty else 1), peaks, start
