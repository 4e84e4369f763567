"""Results from several hosts and devices: grouping rows, per-host peaks, the hosts section.

A sweep on a Dask cluster (:mod:`attnbench.sweep.cluster`), or results gathered from several
machines, holds rows timed on different hosts, and on a GPU host, rows of the CPU and
of the GPU.  Their times must not be mixed in one table, plot or fit: a *group* is one
host and one device (:func:`group_labels`: ``"host-a"`` for its CPU, ``"host-a /
NVIDIA H200 (cc 9.0)"`` for its GPU).  The report (:func:`attnbench.report.build.sweep_sections`)
gives each group its own sweep and scaling sections, after :func:`hosts_section`: one
line per group (machine, peaks, points) and, for the points measured in more than one
group, their median times side by side.

Rows without a ``hostname`` (old results) form one group, ``"this host"``; rows without a
``device`` are ``"cpu"``, except those of a GPU backend.
"""

from __future__ import annotations

import pandas as pd

from attnbench.measure.implementations import names
from attnbench.section import Section
from attnbench.studies.scaling import with_parameters

__all__ = ["GROUP_COLUMN", "device_of", "group_labels", "groups", "host_peaks",
           "hosts_section", "scaling_by_group"]

#: Column added to fits (and the comparison table) when there are several groups.
GROUP_COLUMN = "group"
#: Parameters that identify a point (besides its group).
POINT_COLUMNS = ["backend", "L", "d_k", "heads", "kv_heads", "batch", "mask", "dtype",
                 "direction", "variant", "kind"]
#: Machine columns shown per group in the hosts section, when present.
MACHINE_COLUMNS = ["cpu_model", "logical_cores", "numba_threads", "threading_layer", "blas",
                   "numpy", "numba"]
GPU_BACKENDS = names(device="gpu")


def _text(series: pd.Series) -> pd.Series:
    """Strings, with "" for missing values."""
    return series.astype(object).where(series.notna(), "").astype(str)


def device_of(table: pd.DataFrame) -> pd.Series:
    """The device of each row: its ``device`` column, else ``"cpu"`` (``"gpu"`` for GPU
    backends, whose rows lack it only when they did not run)."""
    given = _text(table["device"]) if "device" in table else pd.Series("", index=table.index)
    fallback = table["backend"].map(lambda b: "gpu" if b in GPU_BACKENDS else "cpu")
    return given.where(given != "", fallback)


def group_labels(table: pd.DataFrame) -> pd.Series:
    """``host`` for CPU rows, ``host / device`` for GPU rows."""
    host = (_text(table["hostname"]) if "hostname" in table
            else pd.Series("", index=table.index))
    host = host.where(host != "", "this host")
    device = device_of(table)
    return host.where(device == "cpu", host + " / " + device)


def groups(table: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """``(label, rows)`` per group, in the order groups first appear."""
    if table.empty:
        return []
    labels = group_labels(table)
    return [(label, table[labels == label]) for label in dict.fromkeys(labels)]


def host_peaks(table: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Group label -> dtype -> the peak its rows were measured against (GFLOP/s).

    The median of ``gemm_peak_gflops`` over the group's ok rows (each row carries the
    peak of the host or device that timed it); groups without one are left out.
    """
    if table.empty or "gemm_peak_gflops" not in table:
        return {}
    peaks = {}
    for label, rows in groups(table):
        rows = rows[rows["status"] == "ok"]
        values = pd.to_numeric(rows["gemm_peak_gflops"], errors="coerce")
        by_dtype = values.groupby(rows["dtype"]).median().dropna()
        if not by_dtype.empty:
            peaks[label] = {str(dtype): float(value) for dtype, value in by_dtype.items()}
    return peaks


def scaling_by_group(table: pd.DataFrame, fit) -> pd.DataFrame:
    """``fit(rows)`` (e.g. :func:`attnbench.studies.scaling.scaling_table`) per group.

    One group: ``fit(table)`` as it is.  Several: the fits of each group, with a
    ``group`` column first, so that no series mixes hosts.
    """
    parts = groups(table)
    if len(parts) <= 1:
        return fit(table)
    fits = [fit(rows).assign(**{GROUP_COLUMN: label}) for label, rows in parts]
    fits = [f for f in fits if not f.empty]
    if not fits:
        return fit(table.iloc[:0])
    joined = pd.concat(fits, ignore_index=True)
    return joined[[GROUP_COLUMN] + [c for c in joined if c != GROUP_COLUMN]]


def hosts_section(table: pd.DataFrame) -> Section:
    """One line per group, then the median times of points measured in several groups."""
    parts = groups(table)
    peaks = host_peaks(table)
    lines = []
    for label, rows in parts:
        line = {"group": label, "device": device_of(rows).iloc[0]}
        for column in MACHINE_COLUMNS:
            if column in rows:
                line[column] = rows[column].dropna().iloc[0] if rows[column].notna().any() else ""
        for dtype, value in sorted(peaks.get(label, {}).items()):
            line[f"peak {dtype} GFLOP/s"] = value
        counts = rows["status"].value_counts()
        line.update(points=len(rows), ok=int(counts.get("ok", 0)),
                    failed=int(counts.get("failed", 0)), skipped=int(counts.get("skipped", 0)))
        lines.append(line)
    tables = [("One line per host and device", pd.DataFrame(lines))]
    text = (f"These results come from {len(parts)} groups (a group is one host, and one "
            "device of it: its CPU or a GPU). Each group has its own sweep and scaling "
            "sections below, with the peak of its own machine as the reference line; "
            "times of different groups are never mixed in one table, plot or fit.")
    comparison = _comparison(table)
    if comparison is not None:
        tables.append(("Median time (ms) of the points measured in more than one group, "
                       "and each group's time over the first group's", comparison))
    else:
        text += " No point was measured in more than one group."
    return Section(title="Hosts and devices", anchor="hosts", text=text, tables=tables)


def ratio_table(ok: pd.DataFrame, index: list, columns: str, order=None,
                min_columns: int = 1) -> pd.DataFrame:
    """Median times side by side and their ratios to the first column.

    Parameters
    ----------
    ok : pandas.DataFrame
        Rows that ran (``median_ms``).
    index : list of str
        What identifies a point (e.g. L, mask, dtype).
    columns : str
        What is compared (a backend, a host group): one column of medians each.
    order : sequence, optional
        The columns' order; the first is the baseline of the ratios ``"X / first"``.
    min_columns : int, default 1
        Keep only points measured in at least this many columns.

    Returns
    -------
    pandas.DataFrame
        One row per point: ``index``, one median column per compared value, the ratios.
    """
    wide = ok.pivot_table(index=index, columns=columns, values="median_ms", aggfunc="median")
    if order is not None:
        wide = wide[[label for label in order if label in wide.columns]]
    wide = wide.dropna(thresh=min_columns)
    if len(wide.columns):
        first = wide.columns[0]
        for label in list(wide.columns[1:]):
            wide[f"{label} / {first}"] = wide[label] / wide[first]
    wide.columns.name = None
    return wide


def _comparison(table: pd.DataFrame) -> pd.DataFrame | None:
    ok = with_parameters(table[table["status"] == "ok"]).assign(
        **{GROUP_COLUMN: group_labels(table)})
    if ok.empty:
        return None
    wide = ratio_table(ok, POINT_COLUMNS, GROUP_COLUMN, order=dict.fromkeys(group_labels(table)),
                       min_columns=2)
    return None if wide.empty else wide.reset_index()
