"""The jobs behind ``attnbench sweep`` and the main job ``attnbench run``.

``attnbench run`` first checks every backend against the reference (the agreement
table, :mod:`attnbench.sweep.agreement`, driven by :mod:`attnbench.cli`), then
:func:`run_job` does the rest:

1. a sweep of the "quick" grid (:data:`attnbench.sweep.grid.GRIDS`; "tiny" with
   ``--grid tiny``), saved as ``sweep.csv`` / ``sweep.parquet`` / ``sweep.json``;
2. the scaling fits of that sweep (:mod:`attnbench.studies.scaling`), saved as ``scaling.csv``
   and printed;
3. the sections that are computed, not read from a table (:data:`SECTION_PRODUCERS`):
   the attention heat maps, softmax stability, parameter arithmetic and the claims
   ledger, saved under ``sections/``;
4. the HTML report, ``report.html``, built from the saved files by
   :func:`attnbench.report.build.build_report` (what ``attnbench report`` does too);
5. ``run.json``: the duration and the exit status.

Ctrl-C during the sweep keeps the finished points (written out) and exits with 130.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

import pandas as pd

from attnbench.claims import ledger
from attnbench.kernels import has_real_gpu
from attnbench.measure.problems import ONE_BLAS_THREAD_BACKENDS
from attnbench.report import build as report
from attnbench.report import heatmaps
from attnbench.report import html as html_report
from attnbench.report.hosts import host_peaks, scaling_by_group
from attnbench.section import Section
from attnbench.studies import params, stability
from attnbench.studies.scaling import scaling_table
from attnbench.sweep.agreement import run_agreement
from attnbench.sweep.cluster import DaskExecutor
from attnbench.sweep.files import save_results
from attnbench.sweep.grid import GRIDS, Grid, expand, grid_from_mapping, load_grid_file
from attnbench.sweep.journal import JOURNAL_NAME, Journal, journaled, load_journal, point_key
from attnbench.sweep.run import points_summary, run_sweep, serial_executor

__all__ = ["SECTION_PRODUCERS", "computed_sections", "run_command", "run_job", "sweep_command"]

#: Exit status of a command stopped by Ctrl-C (128 + SIGINT), as shells report it.
EXIT_INTERRUPTED = 130

#: Columns printed for each point of a sweep.
CONSOLE_COLUMNS = {
    "backend": "backend", "L": "L", "d_k": "d_k", "heads": "H", "kv_heads": "Hkv",
    "batch": "B", "mask": "mask", "dtype": "dtype", "direction": "dir", "variant": "variant",
    "kind": "kind", "status": "status",
    "median_ms": "median ms", "iqr_ms": "IQR ms", "gflops": "GFLOP/s",
    "pct_of_gemm_peak": "% GEMM", "pct_of_read_bandwidth": "% read BW",
    "peak_mem_mib": "mem MiB", "max_abs_err": "max|err|",
}


def _point_label(row) -> str:
    """``backend L=… mask dtype`` and, when not the default, direction and variant."""
    extra = [str(getattr(row, name, "")) for name in ("direction", "variant", "kind")
             if getattr(row, name, "") not in ("", "forward", "none", "dense")]
    return " ".join([f"{row.backend} L={row.L} {row.mask} {row.dtype}", *extra])


def format_points(table: pd.DataFrame) -> str:
    """The sweep table as fixed-width text (below it: reasons of skipped points, faults)."""
    shown = table.assign(peak_mem_mib=table.get("peak_mem_bytes", float("nan")) / 2**20)
    shown = shown[[c for c in CONSOLE_COLUMNS if c in shown]].rename(columns=CONSOLE_COLUMNS)
    text = shown.to_string(index=False, na_rep="-", float_format=lambda x: f"{x:.3g}")
    not_ok = table[table["status"] != "ok"]
    # a fault's "% GEMM" is left out ("-"): the line below says why
    faults = table[table["fault"].fillna("") != ""] if "fault" in table else table.iloc[:0]
    for rows, column in ((not_ok, "reason"), (faults, "fault")):
        text += "".join(f"\n  {_point_label(row)}: {getattr(row, column)}"
                        for row in rows.itertuples())
    return text


def print_verdicts(fits: pd.DataFrame, file=None) -> None:
    """One line per measured fit (FLOP counts left out: they are not measurements)."""
    file = sys.stdout if file is None else file
    measured = fits[fits["quantity"] != "flops"] if not fits.empty else fits
    if measured.empty:
        print("Scaling: no series varies a parameter over 3 or more values.", file=file)
        return
    print("Scaling (exponent [95% interval]; time: wall clock, cpu: CPU time):", file=file)
    for row in measured.itertuples():
        fixed = " ".join(str(getattr(row, name)) for name in ("backend", "mask", "dtype"))
        fixed += "".join(f" {value}" for value in (getattr(row, "variant", "none"),
                                                    getattr(row, "direction", "forward"),
                                                    getattr(row, "kind", "dense"))
                         if isinstance(value, str) and value not in ("none", "forward", "dense",
                                                                     ""))
        if "group" in measured:  # results of several hosts: say which
            fixed = f"{row.group}: {fixed}"
        print(f"  [{fixed}] {row.verdict}", file=file)


def _status_of_sweep(table: pd.DataFrame) -> int:
    """1 if a point failed or is outside the tolerance, else 0 (skipped points are fine)."""
    if table.empty:
        return 0
    outside = table.get("within_tolerance", pd.Series(dtype=object)).astype("boolean")
    return int(bool((table["status"] == "failed").any() or outside.eq(False).any()))


# --- attnbench sweep -------------------------------------------------------------------------

#: Grid flags of ``attnbench sweep`` (argparse dest -> grid parameter).
GRID_FLAGS = {"L": "L", "dk": "d_k", "heads": "heads", "kv_heads": "kv_heads",
              "batch": "batch", "mask": "mask", "dtype": "dtype", "backend": "backend",
              "direction": "direction", "variant": "variant", "kind": "kind"}


def grids_from_args(args) -> list[Grid]:
    """The grids of ``attnbench sweep``: ``--config FILE``, ``--grid NAME`` or the flags."""
    given = {param: getattr(args, dest) for dest, param in GRID_FLAGS.items()
             if getattr(args, dest, None) is not None}
    sources = [name for name, used in (("--config", args.config), ("--grid", args.grid),
                                       ("grid flags", given)) if used]
    if len(sources) > 1:
        raise ValueError(f"give the grid one way; got {' and '.join(sources)}")
    if args.config:
        return load_grid_file(args.config)
    if args.grid:
        return list(GRIDS[args.grid])
    return [grid_from_mapping(given, where="flags")]


def sweep_description(args) -> str:
    """The sweep as a command line a reader can rerun: ``attnbench sweep --grid tiny``."""
    if getattr(args, "config", None):
        return f"attnbench sweep --config {args.config}"
    if getattr(args, "grid", None):
        return f"attnbench sweep --grid {args.grid}"
    flags = [f"--{dest.replace('_', '-')} {' '.join(map(str, getattr(args, dest)))}"
             for dest in GRID_FLAGS if getattr(args, dest, None) is not None]
    return " ".join(["attnbench sweep", *flags])


def other_commands_results(out: Path, command: str) -> str | None:
    """What another command left in ``out`` that ``command`` would overwrite, or None.

    ``attnbench run`` leaves ``run.json``; every sweep's ``sweep.json`` names the command
    that wrote it (``"command"``).
    """
    if command != "attnbench run" and (out / "run.json").exists():
        return f"{out} holds the results of 'attnbench run' (run.json)"
    meta = out / "sweep.json"
    if meta.exists():
        try:
            writer = json.loads(meta.read_text()).get("command", "")
        except (OSError, ValueError):
            writer = ""
        if writer and not writer.startswith(command):
            return f"{out} holds the sweep of '{writer}' (sweep.json)"
    return None


def sweep_command(args) -> int:
    """``attnbench sweep``: run a grid, print and save the table and the fits.

    Every finished point is appended to ``OUT/sweep.jsonl`` at once
    (:mod:`attnbench.sweep.journal`); ``--resume`` runs only the points not done there.
    ``--cluster`` runs the points on Dask (:mod:`attnbench.sweep.cluster`) instead of here.
    A folder that holds another command's results (``attnbench run``'s) is left alone
    unless ``--force`` is given: the sweep would replace its ``sweep.*`` and
    ``scaling.csv`` under a report that says ``run`` measured them.
    """
    import contextlib

    try:
        grids = grids_from_args(args)
    except (ValueError, OSError) as exc:
        print(f"attnbench sweep: error: {exc}", file=sys.stderr)
        return 2
    points = expand(grids)
    out = Path(args.out)
    taken = other_commands_results(out, "attnbench sweep")
    if taken and not getattr(args, "force", False):
        print(f"attnbench sweep: error: {taken}; a sweep would overwrite them. Give another "
              "--out, or --force to overwrite", file=sys.stderr)
        return 2
    cluster = getattr(args, "cluster", None)
    resume = getattr(args, "resume", False)
    journal_path = out / JOURNAL_NAME
    memory_budget = None if args.memory_budget is None else args.memory_budget * 2**30
    print(f"Sweep: {points_summary(points)}; results in {args.out}", flush=True)
    done = {}
    if resume:
        found = load_journal(journal_path)
        wanted = {point_key(point) for point in points}
        done = {key: row for key, row in found.done().items() if key in wanted}
        print(f"Resume: {len(done)} of {len(points)} points are done in {journal_path}; "
              f"running the other {len(points) - len(done)}"
              + (f" ({found.unreadable_lines} unreadable line(s) ignored)"
                 if found.unreadable_lines else ""), flush=True)
    settings = {"max_time": args.max_time, "oracle_limit": args.oracle_limit,
                "memory_budget": memory_budget, "threads": args.threads,
                "cluster": str(cluster) if cluster else None}
    with contextlib.ExitStack() as stack:
        executor, gemm_peaks, threads = serial_executor, None, args.threads
        resumed_threads = {int(row["threads"]) for row in done.values()
                           if isinstance(row.get("threads"), int | float)
                           and row["threads"] == row["threads"]  # not None, not nan
                           and row.get("backend") not in ONE_BLAS_THREAD_BACKENDS}
        if threads is None and len(resumed_threads) == 1:
            # The new points run on the thread count of the resumed ones (the cores check
            # chose it, or --threads), so that one fit never mixes two counts.
            threads = int(next(iter(resumed_threads)))
        if cluster and len(done) < len(points):
            try:
                executor = stack.enter_context(DaskExecutor(
                    cluster, threads=args.threads, memory_budget=memory_budget))
            except (RuntimeError, ValueError, OSError) as exc:
                print(f"attnbench sweep: error: {exc}", file=sys.stderr)
                return 2
            print(executor.describe(), flush=True)
            # Each worker measures its own host's GEMM peak, on the sweep's threads.
            gemm_peaks, threads = {}, None
        journal = stack.enter_context(Journal(journal_path, resume=resume, settings=settings))
        result = run_sweep(points, max_time=args.max_time, oracle_limit=args.oracle_limit,
                           memory_budget=memory_budget, progress=not args.no_progress,
                           threads=threads, gemm_peaks=gemm_peaks,
                           executor=journaled(executor, journal, done))
    if result.cores is not None and args.no_progress:
        print(f"Threads: {result.cores.describe()}.", flush=True)
    result.table = _in_point_order(result.table, points)
    by_host = host_peaks(result.table)
    if len(by_host) == 1 and not result.gemm_peaks:
        result.gemm_peaks = next(iter(by_host.values()))
    written = save_results(result, args.out, extra_meta={
        "command": sweep_description(args), "threads": args.threads,
        "cluster": settings["cluster"], "resumed_points": len(done),
        "journal": JOURNAL_NAME, "gemm_peak_gflops_by_host": by_host,
        "machines": load_journal(journal_path).machines})
    if not result.table.empty:
        print(format_points(result.table))
    if result.interrupted:
        print(f"\nInterrupted: kept {len(result.table)} of {len(points)} points in "
              f"{', '.join(map(str, written))} (and {journal_path}: --resume goes on).")
        return EXIT_INTERRUPTED
    fits = scaling_by_group(result.table, scaling_table)
    fits.to_csv(out / "scaling.csv", index=False)
    print()
    print_verdicts(fits)
    print(f"\nWrote {', '.join(map(str, written))} and scaling.csv in {result.seconds:.1f} s. "
          f"'attnbench report {args.out}' makes the HTML report.")
    return _status_of_sweep(result.table)


def _in_point_order(table: pd.DataFrame, points) -> pd.DataFrame:
    """The rows in the order of ``points`` (executors may finish them in any order)."""
    if table.empty or "point_key" not in table:
        return table
    order = {point_key(point): index for index, point in enumerate(points)}
    rank = table["point_key"].map(order)
    return table.iloc[rank.argsort(kind="stable")].reset_index(drop=True)


# --- attnbench run ---------------------------------------------------------------------------


#: Producers of the computed sections, in report order: (name, function returning a
#: Section or a list of them).  The heat maps first, then the studies and the ledger.
SECTION_PRODUCERS = (
    ("attention heat maps", heatmaps.heatmap_section),
    ("softmax stability", stability.section),
    ("parameter arithmetic", params.section),
    ("claims ledger", ledger.section),
)


def computed_sections() -> tuple[list[Section], list[str]]:
    """The heat maps, the studies' and the ledger's sections; ``(sections, problems)``.

    A producer that raises gets a section with the traceback, and a line in ``problems``.
    """
    sections, problems = [], []
    for name, produce in SECTION_PRODUCERS:
        started = time.perf_counter()
        try:
            result = produce()
            new = list(result) if isinstance(result, list | tuple) else [result]
        except Exception as exc:  # one broken study must not lose the whole report
            problems.append(f"{name} ({produce.__module__}.{produce.__name__}) raised "
                            f"{type(exc).__name__}: {exc}")
            new = [Section(title=f"{name} failed", text=traceback.format_exc())]
        sections += new
        print(f"  {name}: {len(new)} section(s) in {time.perf_counter() - started:.1f} s",
              flush=True)
    return sections, problems


def claims_lines(sections) -> list[str]:
    """``C01 holds: <measured>`` for every row of the claims section's table, if any."""
    for section in sections:
        if section.anchor == "claims" and section.tables:
            table = section.tables[0][1]
            if {"id", "verdict"} <= set(table.columns):
                measured = table["measured"] if "measured" in table else [""] * len(table)
                return [f"  {id_} {verdict}: {value}" for id_, verdict, value in
                        zip(table["id"], table["verdict"], measured, strict=True)]
    return []


def run_job(args, *, agreement_status: int, started: float,
            sweep_max_time: float = 0.1) -> int:
    """Everything ``attnbench run`` does after the agreement check; returns the exit status.

    Parameters
    ----------
    args : argparse.Namespace
        ``run``'s arguments (``out``, ``grid``, ``backends``).
    agreement_status : int
        0 if every backend agreed with the reference, else 1.
    started : float
        ``time.perf_counter()`` at the start of the run.
    sweep_max_time : float
        Timing budget per sweep point (s).
    """

    out = Path(args.out)
    grid_name = "tiny" if args.grid == "tiny" else "quick"
    grids = list(GRIDS[grid_name])
    if has_real_gpu():
        grids.append(Grid(L=grids[0].L, d_k=grids[0].d_k, heads=grids[0].heads,
                          mask=grids[0].mask, backend=("cuda",)))
    points = expand(grids)
    if args.backends:  # kernels' backends as asked; the peers (numpy, torch) always join
        points = [p for p in points if p.backend in args.backends or p.backend in
                  ("numpy", "torch")]
    print(f"\nSweep '{grid_name}': {points_summary(points)}", flush=True)
    threads = getattr(args, "threads", None)
    # The sweep probes the GEMM peak through its run (on its thread count); the peak is the
    # maximum over those probes and the agreement check's (machine.gemm_peak_gflops).
    result = run_sweep(points, max_time=sweep_max_time, threads=threads)
    written = save_results(result, out, extra_meta={
        "command": f"attnbench run --grid {args.grid}", "grid": grid_name, "threads": threads})
    print(format_points(result.table) if not result.table.empty else "(no point finished)")
    if result.interrupted:
        print(f"\nInterrupted: kept {len(result.table)} of {len(points)} points in "
              f"{', '.join(map(str, written))}; no report written.")
        return EXIT_INTERRUPTED
    fits = scaling_table(result.table)
    fits.to_csv(out / "scaling.csv", index=False)
    print()
    print_verdicts(fits)

    print("\nStudies for the report:", flush=True)
    sections, problems = computed_sections()
    html_report.save_sections(sections, out / report.SECTIONS_DIR)
    claims = claims_lines(sections)
    if claims:
        print("\nClaims (verdict: measured):\n" + "\n".join(claims))
    status = max(agreement_status, _status_of_sweep(result.table), int(bool(problems)))
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    run_record = {"grid": args.grid, "sweep_grid": grid_name, "exit_status": status,
                  "problems": problems, "seconds_before_report": time.perf_counter() - started}
    html_path = report.build_report(out, run=run_record)  # quotes seconds_before_report
    elapsed = time.perf_counter() - started
    run_record["seconds"] = elapsed
    (out / "run.json").write_text(json.dumps(run_record, indent=2) + "\n")
    print(f"\nWrote {html_path} (and the tables beside it) in {elapsed:.0f} s; exit status "
          f"{status}.")
    return status


def run_command(args) -> int:
    """``attnbench run``: the agreement table (:func:`~attnbench.sweep.agreement.run_agreement`),
    then :func:`run_job` (sweep, fits, studies, report)."""
    status, _, started = run_agreement(args.out, grid=args.grid, backends=args.backends,
                                       max_time=args.max_time)
    if status == 2:
        return 2
    return run_job(args, agreement_status=status, started=started,
                   sweep_max_time=args.sweep_max_time)
