"""The ``sweep`` command: a grid of points timed and checked, the table and the fits saved.

:func:`add_sweep` declares the arguments; :func:`sweep_command` runs the grid the flags,
a file (``--config``) or a name (``--grid``) give: every finished point is appended to
the journal ``OUT/sweep.jsonl`` as it finishes (:mod:`attnbench.sweep.journal`, so
``--resume`` goes on where a run stopped), the points run here or on Dask (``--cluster``,
:mod:`attnbench.sweep.cluster`), and the table, its scaling fits
(:mod:`attnbench.studies.scaling`) and the verdicts are written and printed.  A folder
that holds the results of ``attnbench run`` is left alone without ``--force``: its
report would then describe a sweep that ``run`` did not measure.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import pandas as pd

from attnbench.cli.arguments import backend_name, cluster_spec, positive_int, variant
from attnbench.cli.console import EXIT_INTERRUPTED, format_points, print_verdicts, status_of_sweep
from attnbench.measure.problems import ONE_BLAS_THREAD_BACKENDS
from attnbench.report.hosts import host_peaks, scaling_by_group
from attnbench.studies.scaling import scaling_table
from attnbench.sweep.cluster import DaskExecutor
from attnbench.sweep.files import save_results
from attnbench.sweep.grid import (
    BACKENDS,
    DEFAULTS,
    DIRECTIONS,
    DTYPES,
    GRIDS,
    KINDS,
    MASK_KINDS,
    Grid,
    expand,
    grid_from_mapping,
    load_grid_file,
)
from attnbench.sweep.journal import JOURNAL_NAME, Journal, journaled, load_journal, point_key
from attnbench.sweep.run import points_summary, run_sweep, serial_executor
from attnbench.sweep.runner import ORACLE_LIMIT

__all__ = ["GRID_FLAGS", "add_sweep", "grids_from_args", "other_commands_results",
           "sweep_command", "sweep_description"]


def add_sweep(subparsers) -> None:
    parser = subparsers.add_parser(
        "sweep", help="time, memory and error over a grid of L, d_k, heads, batch, masks, "
                      "directions and variants",
        description=(
            "Measure every point of a grid: median time and IQR, GFLOP/s (visible pairs) "
            "and % of the GEMM peak measured in the same run, peak extra memory of a call, "
            "max error against the oracle; then fit the scaling exponents. The grid comes "
            "from the flags (each takes one or more values; unset ones take the default "
            "shown), from --config FILE (TOML, or YAML with pyyaml: parameters at the top "
            "level, or several [[grid]] tables whose union is swept), or from --grid NAME. "
            "Backends: numba, reference, cuda (real GPU only), and the peers numpy (plain "
            "formula) and torch (PyTorch SDPA on the CPU); one that cannot run here or "
            "cannot express the point (the numpy peer's backward, softcap in a peer), or a "
            "point that would need more memory than the budget, is recorded as skipped "
            "with the reason. Writes OUT/sweep.csv, sweep.parquet (if pyarrow or "
            "fastparquet is installed), sweep.json and scaling.csv, and appends each point "
            "to OUT/sweep.jsonl as it finishes (--resume goes on from there); 'attnbench "
            "report OUT' renders them. A folder holding the results of 'attnbench run' is "
            "left alone unless --force is given. Exit status: 0 if every point ran or was "
            "skipped and agrees with the oracle, 1 if one failed or is outside the "
            "tolerance, 2 for a bad grid or cluster or a folder of 'attnbench run' without "
            "--force, 130 on Ctrl-C (the finished points are written)."),
    )
    grid = parser.add_argument_group("grid (flags)")
    for flag, dest, kwargs in (
        ("--L", "L", {"type": positive_int, "metavar": "N", "help": "sequence lengths"}),
        ("--dk", "dk", {"type": positive_int, "metavar": "N", "help": "head sizes d_k"}),
        ("--heads", "heads", {"type": positive_int, "metavar": "N", "help": "query heads"}),
        ("--kv-heads", "kv_heads", {"type": positive_int, "metavar": "N",
                                    "help": "key/value heads, for GQA"}),
        ("--batch", "batch", {"type": positive_int, "metavar": "N", "help": "batch sizes"}),
        ("--mask", "mask", {"choices": MASK_KINDS, "metavar": "KIND",
                            "help": f"mask kinds, from {', '.join(MASK_KINDS)}"}),
        ("--dtype", "dtype", {"choices": DTYPES, "metavar": "DTYPE",
                              "help": f"dtypes, from {', '.join(DTYPES)}"}),
        ("--backend", "backend", {"type": backend_name, "metavar": "NAME",
                                  "help": f"backends, from {', '.join(BACKENDS)}, or any "
                                          "implementation as 'attnbench conform' names it: "
                                          "module:function (kernels convention) or a name "
                                          "another package registered under "
                                          "attnbench.implementations"}),
        ("--direction", "direction", {
            "choices": DIRECTIONS, "metavar": "DIR",
            "help": "forward (time attention) and/or backward (time attention_backward "
                    "given the forward's out and lse; torch through autograd, numpy has "
                    "none)"}),
        ("--variant", "variant", {
            "type": variant, "metavar": "NAME",
            "help": "attention variants (kernels.mods): none, window-W (causal sliding "
                    "window, keys i-W..i), documents-N (N equal documents), alibi, softcap "
                    "(cap 30), sinks (one attention-sink logit per head); FLOPs count only "
                    "visible pairs"}),
        ("--kind", "kind", {
            "choices": KINDS, "metavar": "KIND",
            "help": "entry points: dense (L queries, L keys), decode (one query per "
                    "sequence against a cache of L keys, attention_with_kvcache; rows say "
                    "the K/V bytes read per second against the read-bandwidth probe), "
                    "varlen (a packed batch of --batch sequences of lengths L, L/2, L/4, "
                    "..., attention_varlen)"}),
    ):
        default = DEFAULTS["d_k" if dest == "dk" else dest]
        shown = "= heads" if default == (None,) else " ".join(map(str, default))
        kwargs["help"] += f" (default: {shown})"
        grid.add_argument(flag, dest=dest, nargs="+", **kwargs)
    parser.add_argument("--config", metavar="FILE", type=Path,
                        help="read the grid from a TOML (or YAML) file instead of the flags")
    parser.add_argument("--grid", choices=sorted(GRIDS),
                        help="a named grid instead of the flags: 'quick' is what "
                             "'attnbench run' sweeps, 'tiny' a smoke test")
    parser.add_argument("--out", metavar="DIR", type=Path, default=Path("reports/sweep"),
                        help="folder for the results, created if missing; not the folder of "
                             "'attnbench run', whose report would then describe another "
                             "sweep (default: %(default)s)")
    parser.add_argument("--force", action="store_true",
                        help="write into --out even if it holds the results of 'attnbench "
                             "run', replacing their sweep.* and scaling.csv")
    parser.add_argument("--max-time", metavar="SECONDS", type=float, default=0.2,
                        help="timing budget per point; at least 3 batches are timed "
                             "(default: %(default)s)")
    parser.add_argument("--oracle-limit", metavar="N", type=positive_int,
                        default=ORACLE_LIMIT,
                        help="largest problem (score entries B*H*L^2) whose error against "
                             "the oracle is computed; a quarter of it for float64 "
                             "(default: %(default)s)")
    parser.add_argument("--memory-budget", metavar="GB", type=float,
                        help="skip points whose L x L arrays would need more (default: half "
                             "of the available memory)")
    parser.add_argument("--threads", metavar="N", type=positive_int,
                        help="at most N threads for Numba, BLAS, OpenMP and torch, GEMM peak "
                             "included (default: all of Numba's, fewer where a check before "
                             "a sweep run here finds them waiting for cores other processes "
                             "hold)")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar on stderr")
    parser.add_argument("--cluster", metavar="SPEC", type=cluster_spec,
                        help="run the points on Dask (pip install 'attnbench[cluster]'): "
                             "local:N starts N worker processes here (on 127.0.0.1, no "
                             "dashboard); tcp://HOST:PORT uses a running scheduler whose hosts "
                             "each have one worker started with --resources timing=1. "
                             "One timing at a time per host; the error checks run beside "
                             "them. Default: in this process")
    parser.add_argument("--resume", action="store_true",
                        help="run only the points not done in OUT/sweep.jsonl (the journal "
                             "every sweep appends each finished point to; failed points "
                             "run again); without it a sweep starts a new journal")
    parser.set_defaults(handler=sweep_command)


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
    return status_of_sweep(result.table)


def _in_point_order(table: pd.DataFrame, points) -> pd.DataFrame:
    """The rows in the order of ``points`` (executors may finish them in any order)."""
    if table.empty or "point_key" not in table:
        return table
    order = {point_key(point): index for index, point in enumerate(points)}
    rank = table["point_key"].map(order)
    return table.iloc[rank.argsort(kind="stable")].reset_index(drop=True)
