"""The HTML report of a results folder, rebuilt from what is saved there (``attnbench report``).

A results folder (``reports/`` by default) holds what ``attnbench run`` or ``attnbench
sweep`` wrote.  :func:`collect_sections` turns it into report sections without running
anything again:

- ``agreement.csv`` (``run``'s agreement check) -> the agreement section;
- ``sweep.parquet`` or ``sweep.csv`` with ``sweep.json`` -> the sweep section and the
  scaling section (the fits are recomputed from the saved rows by
  :func:`attnbench.studies.scaling.scaling_table`, the function whose verdicts the console
  printed: fitting is arithmetic, not measuring, and its verdicts are shown as it decides
  them, never reworded here); with rows from several hosts or devices
  (:mod:`attnbench.report.hosts`), a hosts section and a sweep and a scaling section per
  host and device (:func:`sweep_sections`);
- ``sections/`` -> the sections saved as they were computed (the attention heat maps,
  the softmax-stability study, parameter arithmetic, the claims ledger), in order;
- ``machine.json`` / ``sweep.json`` -> the machine record, last.

:func:`build_report` renders them into one HTML file (default ``<folder>/report.html``).
``attnbench run`` writes its report through the same function, so ``attnbench report``
rebuilds exactly what ``run`` showed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from attnbench.report import hosts, plots, summary, variants, verdicts
from attnbench.report import html as html_report
from attnbench.section import Section
from attnbench.studies import scaling
from attnbench.sweep import files as sweep_files

__all__ = ["REPORT_NAME", "agreement_section", "build_report", "collect_sections",
           "machine_section", "provenance", "sweep_section", "sweep_sections"]

REPORT_NAME = "report.html"
SECTIONS_DIR = "sections"


def agreement_section(table: pd.DataFrame) -> Section:
    """Every backend against the reference (``attnbench run``'s check), summarised."""
    ok = table["ok"].astype(bool)
    summary = (table.assign(err_over_tol=table["max_abs_err"] / table["tolerance"])
               .groupby(["backend", "dtype"], sort=False)
               .agg(cases=("ok", "size"), agree=("ok", "sum"), max_abs_err=("max_abs_err", "max"),
                    max_err_over_tol=("err_over_tol", "max"),
                    median_gflops=("gflops", "median"))
               .reset_index())
    shown = table[[c for c in ("case", "B", "H", "Hkv", "Lq", "Lk", "D", "Dv", "mask", "dtype",
                               "backend", "max_abs_err", "tolerance", "ok", "median_ms",
                               "gflops", "pct_of_gemm_peak", "error") if c in table]]
    text = (f"{int(ok.sum())}/{len(table)} (case, dtype, backend) rows agree with the oracle. "
            "Cases cross odd shapes (L 97 and 113, d 59), Lq ≠ Lk, Dv ≠ D and GQA with every "
            "mask kind (none, causal, bottom-right causal, bool mask, key_lengths, dropout). "
            "A row agrees when its max abs error against the oracle is within the tolerance "
            "(2 × the error of the same formula computed in the input dtype + 4 ulps).")
    text += _impossible_text(table)
    return Section(title="Agreement with the reference", anchor="agreement", text=text,
                   tables=[("Largest error per backend and dtype", summary),
                           ("Every case", shown)])


#: Columns of the sweep table shown in the report.
REPORT_COLUMNS = ("backend", "L", "d_k", "heads", "kv_heads", "batch", "mask", "dtype",
                  "direction", "variant", "kind", "status",
                  "median_ms", "iqr_ms", "runs", "calls", "gflops", "pct_of_gemm_peak",
                  "threads", "peak_mem_bytes", "max_abs_err", "tolerance", "within_tolerance",
                  "oracle", "h2d_ms", "d2h_ms", "host_call_ms", "launch_overhead_us",
                  "timing_method", "read_gbs", "pct_of_read_bandwidth")


def sweep_section(table: pd.DataFrame, meta: dict | None = None) -> Section:
    """The sweep: what ran, the table, GFLOP/s and error plots."""
    meta = meta or {}
    counts = table["status"].value_counts()
    # The run's peaks, else those the rows carry (each row: its host's or device's peak).
    peaks = meta.get("gemm_peak_gflops") or next(iter(hosts.host_peaks(table).values()), {})
    gpu = bool(hosts.device_of(table).ne("cpu").all()) if not table.empty else False
    peak_words = ("Peak of the device (see below)" if gpu else
                  "GEMM peak measured at the start of this sweep with numpy matmul (n = 1024)")
    text = (
        f"{len(table)} points ({', '.join(f'{n} {s}' for s, n in counts.items())})"
        + (f" of {meta['n_points']} asked for" if meta.get("n_points") else "")
        + (f", in {meta['seconds']:.0f} s" if meta.get("seconds") else "") + "."
        + (" The sweep was interrupted (Ctrl-C): only the finished points are shown."
           if meta.get("interrupted") else "")
        + _threads_text(meta)
        + "\n\nEach point: inputs drawn once (the same for every backend of a problem), one "
        "untimed call (compilation; its output is the one checked against the oracle), then "
        "timed batches after one more warm-up call (attnbench.measure.timing.measure; median and "
        "IQR over batches), then one call under tracemalloc for the peak extra memory "
        "(torch allocates outside Python's allocators: its peak is the rise of the "
        "process's resident set, a lower bound). GFLOP/s counts only visible (query, key) "
        f"pairs. {peak_words}: "
        + (", ".join(f"{name} {value:.1f} GFLOP/s" for name, value in peaks.items()) or "n/a")
        + ". Error: max |output − oracle| (the reference formula in float64, or in extended "
        "precision for float64 inputs), against the tolerance 2 × the error of the same "
        "formula in the input dtype + 4 ulps."
        + _gpu_text(table)
    )
    shown = table[[column for column in REPORT_COLUMNS if column in table]]
    tables = [("Sweep results, one row per point (the reasons of the points not ok are above)"
               if (table["status"] != "ok").any() else "Sweep results, one row per point",
               shown)]
    not_ok = table[table["status"] != "ok"]
    if not not_ok.empty:
        tables.insert(0, ("Points skipped or failed, one line per backend and reason",
                          _not_ok_summary(not_ok)))
        shown = shown[table["status"] == "ok"]
        tables[-1] = ("Sweep results, one row per point that ran", shown)
    text += _impossible_text(table)
    if "within_tolerance" in table:
        outside = table[table["within_tolerance"].astype("boolean").eq(False).fillna(False)]
        if not outside.empty:
            text += (f"\n\n{len(outside)} point(s) are OUTSIDE the tolerance: "
                     + "; ".join(f"{r.backend} L={r.L} {r.mask} {r.dtype}: "
                                 f"{r.max_abs_err:.3g} > {r.tolerance:.3g}"
                                 for r in outside.itertuples()))
    figures = []
    plain = variants.select(table, "forward")  # one kind of call per line
    gflops_figure = plots.gflops_by_backend(plain, peaks,
                                            peak_label="device peak" if gpu else "GEMM peak")
    if gflops_figure is not None:
        figures.append(("GFLOP/s by backend against L, with the GEMM peak of the same run"
                        + (" (forward calls without a variant; the others are in the table)"
                           if len(plain) < len(table) else ""), gflops_figure))
    error_figure = plots.error_by_backend(table)
    if error_figure is not None:
        figures.append(("Max abs error against the oracle by backend (markers: mask kind)",
                        error_figure))
    return Section(title="Sweep", text=text, tables=tables, figures=figures, anchor="sweep")


def _threads_text(meta: dict) -> str:
    """What the sweep ran on: the --threads limit, or what the check of the cores found."""
    cores = meta.get("cores") or {}
    if cores.get("requested") and cores.get("threads", 0) < cores["requested"]:
        return f" Threads: {cores['text']}; the GEMM peak was measured on as many."
    if meta.get("threads"):
        return (f" Every backend ran on at most {meta['threads']} thread(s) (--threads), the "
                "GEMM peak too.")
    return f" Threads: {cores['text']}." if cores.get("text") else ""


def _impossible_text(table: pd.DataFrame) -> str:
    """A warning for points above 100% of the peak: a measurement fault, not a result."""
    if "pct_of_gemm_peak" not in table:
        return ""
    above = table[pd.to_numeric(table["pct_of_gemm_peak"], errors="coerce") > 100]
    if above.empty:
        return ""
    worst = above.loc[above["pct_of_gemm_peak"].idxmax()]
    where = worst.get("case", f"L = {worst.get('L', '?')}")
    return (f"\n\nMeasurement fault: {len(above)} point(s) ran above 100% of the peak (up to "
            f"{worst['pct_of_gemm_peak']:.0f}%, {worst['backend']} on {where}), which "
            "no kernel can: this run's peak was measured too low (other processes slowed "
            "the one GEMM it times). Read their % of peak as unknown, not as a result.")


def _not_ok_summary(not_ok: pd.DataFrame) -> pd.DataFrame:
    """Points that did not run, one line per (backend, status, reason), with their L values."""
    reason = not_ok["reason"].astype(object).where(not_ok["reason"].notna(), "")
    rows = []
    for (backend, status, why), group in not_ok.assign(reason=reason).groupby(
            ["backend", "status", "reason"], sort=False):
        lengths = sorted(set(group["L"].astype(int)))
        rows.append({"backend": backend, "status": status, "points": len(group),
                     "L": " ".join(map(str, lengths)), "masks": " ".join(
                         dict.fromkeys(group["mask"].astype(str))), "reason": why})
    return pd.DataFrame(rows)


def _gpu_text(table: pd.DataFrame) -> str:
    """How GPU points were timed, and their reference line, if the table has any."""
    if "timing_method" not in table:
        return ""
    gpu = table[hosts.device_of(table) != "cpu"]
    methods = [m for m in dict.fromkeys(gpu["timing_method"].dropna()) if m]
    if gpu.empty or not methods:
        return ""
    sources = [s for s in dict.fromkeys(gpu.get("peak_source", pd.Series(dtype=object))
                                        .dropna()) if s]
    return ("\n\nGPU points (attnbench.measure.gpu_timing): inputs copied to the device once, the "
            "kernel timed alone on device arrays (" + "; ".join(methods) + "); host → device "
            "(h2d_ms, q, k and v) and device → host (d2h_ms, the output) copies timed apart; "
            "host_call_ms is the whole NumPy-in NumPy-out call. Peak of the device: "
            + ("; ".join(sources) or "n/a") + ".")


def sweep_sections(table: pd.DataFrame, meta: dict | None = None) -> list[Section]:
    """The sweep and scaling sections; per host and device when there are several.

    One group (:func:`attnbench.report.hosts.groups`): :func:`sweep_section` and the scaling
    section of the whole table.  Several: :func:`attnbench.report.hosts.hosts_section`, then for
    each group its own sweep and scaling sections (titles and anchors name the group),
    each plotted against its own peak.
    """
    meta = meta or {}
    parts = hosts.groups(table)
    if len(parts) <= 1:
        return [sweep_section(table, meta), *verdicts.scaling_sections(table, meta)]
    peaks = hosts.host_peaks(table)
    sections = [hosts.hosts_section(table)]
    for number, (label, rows) in enumerate(parts, start=1):
        group_meta = {key: value for key, value in meta.items()
                      if key not in ("n_points", "gemm_peak_gflops")}
        group_meta["gemm_peak_gflops"] = peaks.get(label, {})
        for section in [sweep_section(rows, group_meta),
                        *verdicts.scaling_sections(rows, group_meta)]:
            section.title = f"{section.title}: {label}"
            section.anchor = f"{section.slug()}-{number}"
            sections.append(section)
    return sections


#: Machine-record fields whose name alone would mislead, with what they are.
MACHINE_LABELS = {"run_seconds": "agreement check seconds (attnbench run's first step)",
                  "load_average_1m": "load average (1 min) before the run"}


def _readable(value) -> str:
    """A record value as text: numbers formatted, lists and dicts as ``key: value`` lists."""
    from attnbench.report.tables import format_number

    if isinstance(value, bool) or value is None:
        return "" if value is None else ("yes" if value else "no")
    if isinstance(value, int | float):
        return format_number(value)
    if isinstance(value, dict):
        return "; ".join(f"{key}: {_readable(item)}" for key, item in value.items()
                         if item not in (None, "", [], {}))
    if isinstance(value, list | tuple):
        return " | ".join(_readable(item) for item in value)
    return str(value)


def machine_section(record: dict, extra: dict | None = None) -> Section:
    """The machine record as a two-column table whose values wrap (class ``kv``)."""
    items = {**record, **(extra or {})}
    table = pd.DataFrame([{"field": MACHINE_LABELS.get(key, key), "value": _readable(value)}
                          for key, value in items.items()])
    table.attrs["html_class"] = "kv"
    return Section(title="Machine", anchor="machine",
                   text="Where and with what this report's numbers were measured.",
                   tables=[("Machine record", table)])


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def collect_sections(folder) -> list[Section]:
    """The report's sections from the files in ``folder`` (see the module docstring).

    Raises
    ------
    FileNotFoundError
        ``folder`` holds none of the files a report is made from.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a folder")
    sections = []
    agreement = None
    if (folder / "agreement.csv").exists():
        agreement = pd.read_csv(folder / "agreement.csv")
        sections.append(agreement_section(agreement))
    meta = {}
    try:
        table, meta = sweep_files.load_results(folder)
    except FileNotFoundError:
        table = None
    fits = None
    if table is not None and not table.empty:
        sections += sweep_sections(table, meta)
        fits = hosts.scaling_by_group(table, scaling.scaling_table)
    saved = html_report.load_sections(folder / SECTIONS_DIR)
    sections += saved
    if not sections:
        raise FileNotFoundError(
            f"{folder} holds no results: expected agreement.csv, sweep.parquet/sweep.csv or "
            f"{SECTIONS_DIR}/ (written by 'attnbench run' or 'attnbench sweep')")
    record = _read_json(folder / "machine.json") or meta.get("machine", {})
    if record:
        extra = ({"gemm_peak_gflops (sweep)": meta["gemm_peak_gflops"]}
                 if "gemm_peak_gflops" in meta else {})
        if (meta.get("machine") or {}).get("gemm_peak_probes"):  # the best of these probes
            extra["gemm_peak_probes (sweep)"] = meta["machine"]["gemm_peak_probes"]
        sections.append(machine_section(record, extra))
    found = summary.cards(agreement=agreement, sweep=table, fits=fits, sections=saved,
                          record=_read_json(folder / "machine.json"), meta=meta)
    return [summary.summary_section(found), *sections]


def _when(path: Path) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(path.stat().st_mtime, UTC).strftime("%Y-%m-%d %H:%M UTC")


def provenance(folder, run: dict | None = None) -> list[str]:
    """Which command wrote each kind of result in ``folder``, and when (file times).

    ``run.json`` marks ``attnbench run``'s agreement check and sections; ``sweep.json``
    names the command that wrote the sweep (results older than that field are said to
    come from an unnamed command).  Nothing is claimed that the files do not record.
    ``run``: the record of the run writing ``folder`` now (before its ``run.json``).
    """
    folder = Path(folder)
    run = _read_json(folder / "run.json") if run is None else run
    run_name = f"attnbench run --grid {run.get('grid', '?')}" if run else ""
    lines = []
    for name, what in (("agreement.csv", "the agreement check"),
                       (SECTIONS_DIR, "the studies and the claims (sections/)")):
        if (folder / name).exists():
            writer = run_name or "attnbench run"
            lines.append(f"{what}: {writer}, {_when(folder / name)}")
    meta_path = folder / "sweep.json"
    if meta_path.exists() or (folder / "sweep.csv").exists():
        meta = _read_json(meta_path)
        writer = meta.get("command") or "a command that did not record its name"
        source = meta_path if meta_path.exists() else folder / "sweep.csv"
        lines.append(f"the sweep (sweep.*): {writer}, {_when(source)}")
    return lines


def _subtitle(folder: Path, run: dict | None) -> str:
    run = _read_json(folder / "run.json") if run is None else run
    sweep_meta = _read_json(folder / "sweep.json")
    machine = _read_json(folder / "machine.json") or sweep_meta.get("machine", {})
    parts = []
    if machine:
        parts.append(f"{machine.get('cpu_model', '?')}, {machine.get('usable_cores', '?')} "
                     f"usable cores, Numba {machine.get('numba', '?')} "
                     f"({machine.get('numba_threads', '?')} threads).")
    seconds = run.get("seconds_before_report", run.get("seconds"))
    sweep_writer = sweep_meta.get("command", "")
    has_sweep = (folder / "sweep.json").exists() or (folder / "sweep.csv").exists()
    if seconds and (not has_sweep or sweep_writer.startswith("attnbench run")):
        parts.append(f"attnbench run (grid '{run.get('grid')}') measured everything here in "
                     f"{seconds:.0f} s.")
    else:
        lines = provenance(folder, run)
        if lines:
            parts.append("Read from " + folder.name + ": " + "; ".join(lines) + ".")
    return " ".join(parts)


def build_report(folder, html_path=None, *, run: dict | None = None) -> Path:
    """Render the report of ``folder`` to ``html_path`` (default ``folder/report.html``).

    ``run``: the record of the ``attnbench run`` writing ``folder`` now (its ``run.json``
    is written after the report, once); otherwise ``folder/run.json`` is read.
    """
    folder = Path(folder)
    html_path = folder / REPORT_NAME if html_path is None else Path(html_path)
    sections = collect_sections(folder)
    return html_report.write_html(html_path, sections, title="attnbench report",
                                  subtitle=_subtitle(folder, run))
