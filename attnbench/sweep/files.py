"""A sweep's files: ``sweep.csv``, ``sweep.parquet`` and ``sweep.json``, written and read back.

:func:`save_results` writes what :func:`attnbench.sweep.run.run_sweep` returns;
:func:`load_results` reads it back for ``attnbench report`` (the Parquet file where an
engine is installed, since it keeps the dtypes; else the CSV, its text columns restored).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from attnbench.measure.machine import machine_record

if TYPE_CHECKING:
    from attnbench.sweep.run import SweepResult

__all__ = ["RESULTS_STEM", "load_results", "parquet_engine", "save_results"]

RESULTS_STEM = "sweep"


def parquet_engine() -> str | None:
    """The installed Parquet engine pandas can use ("pyarrow" or "fastparquet"), or None."""
    import importlib.util

    for engine in ("pyarrow", "fastparquet"):
        if importlib.util.find_spec(engine) is not None:
            return engine
    return None


def save_results(result: SweepResult, out_dir, *, extra_meta: dict | None = None) -> list[Path]:
    """Write ``sweep.csv``, ``sweep.parquet`` (if an engine is installed) and ``sweep.json``.

    ``sweep.json`` holds what is not per row: the GEMM peaks, whether the sweep was
    interrupted, its duration, the number of points asked for and the machine record.

    Returns
    -------
    list of Path
        The files written.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / f"{RESULTS_STEM}.csv"]
    result.table.to_csv(written[0], index=False)
    engine = parquet_engine()
    if engine is not None:
        written.append(out_dir / f"{RESULTS_STEM}.parquet")
        result.table.to_parquet(written[-1], engine=engine, index=False)
    meta = {"gemm_peak_gflops": result.gemm_peaks, "interrupted": result.interrupted,
            "seconds": result.seconds, "n_points": result.n_points,
            "n_rows": len(result.table), "load_average_1m_start": result.load_average[0],
            "load_average_1m_end": result.load_average[1], "machine": machine_record(),
            "written": [path.name for path in written], **(extra_meta or {})}
    if getattr(result, "read_bandwidth_gbs", None) is not None:  # a sweep with decode points
        meta["read_bandwidth_gbs"] = result.read_bandwidth_gbs
    if getattr(result, "cores", None) is not None:
        cores = result.cores
        meta["cores"] = {"requested": cores.requested, "threads": cores.threads,
                         "wait_shares": cores.wait_shares, "text": cores.describe()}
        if cores.reduced:
            meta["threads"] = cores.threads
    written.append(out_dir / f"{RESULTS_STEM}.json")
    written[-1].write_text(json.dumps(meta, indent=2, default=str) + "\n")
    return written


#: Text columns of a sweep table: read back from CSV as strings, "" where empty.
TEXT_COLUMNS = ("backend", "mask", "dtype", "status", "reason", "memory_method", "oracle",
                "fault", "samples_ms", "cpu_samples_ms")


def load_results(path) -> tuple[pd.DataFrame, dict]:
    """Read a saved sweep back: ``(table, meta)``.

    Parameters
    ----------
    path : path-like
        The folder :func:`save_results` wrote to, or one of its files.  The Parquet file
        is preferred (it keeps the dtypes); the CSV is used without one.

    Raises
    ------
    FileNotFoundError
        No sweep results there.
    """
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    parquet, csv = folder / f"{RESULTS_STEM}.parquet", folder / f"{RESULTS_STEM}.csv"
    if path.suffix == ".csv":
        parquet = None
    if parquet is not None and parquet.exists() and parquet_engine() is not None:
        table = pd.read_parquet(parquet)
    elif csv.exists():
        table = pd.read_csv(csv)
        for column in TEXT_COLUMNS:
            if column in table:
                table[column] = table[column].astype(object).fillna("").astype(str)
    else:
        raise FileNotFoundError(f"no {RESULTS_STEM}.parquet or {RESULTS_STEM}.csv in {folder}")
    meta_path = folder / f"{RESULTS_STEM}.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    return table, meta
