"""The ``run`` command, the main job: every backend against the reference, then a sweep,
its scaling fits, the studies and the HTML report.

:func:`add_run` declares the arguments; :func:`run_command` first checks every backend
against the reference (the agreement table, :func:`attnbench.sweep.agreement.run_agreement`),
then :func:`run_job` does the rest:

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

from attnbench.claims import ledger
from attnbench.cli.arguments import positive_int
from attnbench.cli.console import EXIT_INTERRUPTED, format_points, print_verdicts, status_of_sweep
from attnbench.kernels import has_real_gpu
from attnbench.report import build as report
from attnbench.report import heatmaps
from attnbench.report import html as html_report
from attnbench.section import Section
from attnbench.studies import params, stability
from attnbench.studies.scaling import scaling_table
from attnbench.sweep.agreement import run_agreement
from attnbench.sweep.files import save_results
from attnbench.sweep.grid import GRIDS, Grid, expand
from attnbench.sweep.run import points_summary, run_sweep

__all__ = ["SECTION_PRODUCERS", "add_run", "claims_lines", "computed_sections", "run_command",
           "run_job"]


def add_run(subparsers) -> None:
    parser = subparsers.add_parser(
        "run",
        help="the main job: agreement check, quick sweep, scaling fits, studies, HTML report",
        description=(
            "First, run every available backend (the cuda backend only on a real GPU, unless named "
            "with --backends) on a grid of shapes (odd L and D, Lq != Lk, Dv != D, GQA) "
            "and mask kinds (none, causal, bottom-right, bool mask, key_lengths, dropout) "
            "in float32 and float64. Each row gives the max abs error against the oracle "
            "(the reference formula in float64, or in extended precision for float64 "
            "inputs), the tolerance (2 x the error of the same formula computed in the "
            "input dtype + 4 ulps), whether the backend agrees, its median time and IQR "
            "through kernels.attention, and its GFLOP/s next to the measured GEMM peak. "
            "Prints the table and the machine, writes OUT/agreement.csv (one row per "
            "case, dtype and backend, with the machine columns) and OUT/machine.json. "
            "Then sweep the 'quick' grid (L 256-4096 for numba and the numpy and torch peers, "
            "to 2048 for the reference; d_k, heads and batch for numba; the backward pass "
            "over L for numba and torch; causal sliding windows W 64 and 256 over L "
            "1024-16384 and 8 equal documents for numba) into "
            "OUT/sweep.csv, sweep.parquet and sweep.json, fit the scaling exponents "
            "(OUT/scaling.csv), compute the attention heat maps and the studies of "
            "softmax stability, parameter arithmetic and the claims ledger "
            "(OUT/sections/), and render OUT/report.html from those files. "
            "On a fresh clone the kernels' first compilation comes first; a busy machine "
            "makes the timed calls run on fewer threads (said in the report). "
            "Exit status: 0 if every backend agrees everywhere and every sweep point "
            "ran (or was skipped for a stated reason) within the tolerance and every study "
            "ran, 1 otherwise, 130 if interrupted during the sweep (finished points kept)."
        ),
    )
    parser.add_argument("--out", metavar="DIR", default="reports", type=Path,
                        help="folder for everything the run writes, created if missing "
                             "(default: %(default)s)")
    parser.add_argument("--grid", choices=("default", "tiny"), default="default",
                        help="'default': agreement on 5 shapes x 6 mask kinds x 2 dtypes "
                             "(measured on 2 cores with Numba's compile cache warm: 7-10 s "
                             "idle, 47 s busy; the first time, while the kernels compile: "
                             "56 s idle, 203 s busy) and the 'quick' sweep; 'tiny': one "
                             "small shape and the 'tiny' sweep, a smoke test (whole job on "
                             "a busy machine: 56 s warm, 116 s the first time) (default: "
                             "%(default)s)")
    parser.add_argument("--backends", nargs="+", metavar="NAME",
                        choices=("reference", "numba", "cuda"),
                        help="backends to run, from reference, numba, cuda (default: all "
                             "available; cuda only on a real GPU, since Numba's CUDA "
                             "simulator is far too slow for these shapes)")
    parser.add_argument("--max-time", metavar="SECONDS", type=float, default=0.05,
                        help="timing budget per case, dtype and backend; at least 3 calls "
                             "are timed anyway (default: %(default)s)")
    parser.add_argument("--sweep-max-time", metavar="SECONDS", type=float, default=0.1,
                        help="timing budget per sweep point (default: %(default)s)")
    parser.add_argument("--threads", metavar="N", type=positive_int,
                        help="run the sweep (and its GEMM peak) on at most N threads: "
                             "Numba, BLAS, OpenMP, torch (default: all of Numba's, fewer "
                             "where a check before the sweep finds them waiting for cores "
                             "other processes hold)")
    parser.set_defaults(handler=run_command)


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
    status = max(agreement_status, status_of_sweep(result.table), int(bool(problems)))
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
