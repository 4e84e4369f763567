"""The ``attnbench`` command (also ``python -m attnbench``).

One subcommand per task, each a ``_add_<name>`` function that declares its arguments
and a ``_<name>`` function that runs it and returns the exit code; :data:`COMMANDS`
lists them.  So far there is ``run``: every backend against the reference.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from . import __version__

#: Columns of the console table, with their headers.
DISPLAY_COLUMNS = {
    "case": "case", "B": "B", "H": "H", "Hkv": "Hkv", "Lq": "Lq", "Lk": "Lk", "D": "D",
    "Dv": "Dv", "mask": "mask", "dtype": "dtype", "backend": "backend",
    "max_abs_err": "max|err|", "tolerance": "tol", "ok": "agree",
    "median_ms": "median ms", "iqr_ms": "IQR ms", "gflops": "GFLOP/s",
    "pct_of_gemm_peak": "% GEMM",
}


def _format_table(table: pd.DataFrame) -> str:
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


def _add_run(subparsers) -> None:
    parser = subparsers.add_parser(
        "run",
        help="check every backend against the reference on a grid of shapes and masks",
        description=(
            "Run every available backend (the cuda backend only on a real GPU, unless named "
            "with --backends) on a grid of shapes (odd L and D, Lq != Lk, Dv != D, GQA) "
            "and mask kinds (none, causal, bottom-right, bool mask, key_lengths, dropout) "
            "in float32 and float64. Each row gives the max abs error against the oracle "
            "(the reference formula in float64, or in extended precision for float64 "
            "inputs), the tolerance (2 x the error of the same formula computed in the "
            "input dtype + 4 ulps), whether the backend agrees, its median time and IQR "
            "through kernels.attention, and its GFLOP/s next to the measured GEMM peak. "
            "Prints the table and the machine, writes OUT/agreement.csv (one row per "
            "case, dtype and backend, with the machine columns) and OUT/machine.json. "
            "Exit status: 0 if every backend agrees everywhere, 1 otherwise."
        ),
    )
    parser.add_argument("--out", metavar="DIR", default="reports", type=Path,
                        help="folder for agreement.csv and machine.json, created if "
                             "missing (default: %(default)s)")
    parser.add_argument("--grid", choices=("default", "tiny"), default="default",
                        help="'default': 5 shapes x 6 mask kinds x 2 dtypes (about 10 s "
                             "on 2 cores); 'tiny': one small shape, a smoke test of a few "
                             "seconds (default: %(default)s)")
    parser.add_argument("--backends", nargs="+", metavar="NAME",
                        choices=("reference", "numba", "cuda"),
                        help="backends to run, from reference, numba, cuda (default: all "
                             "available; cuda only on a real GPU, since Numba's CUDA "
                             "simulator is far too slow for these shapes)")
    parser.add_argument("--max-time", metavar="SECONDS", type=float, default=0.05,
                        help="timing budget per case, dtype and backend; at least 3 calls "
                             "are timed anyway (default: %(default)s)")
    parser.set_defaults(handler=_run)


def _run(args) -> int:
    from .agreement import GRIDS, MASK_KINDS, agreement_table, select_backends
    from .machine import gemm_peak_gflops, machine_record, summary_lines

    start = time.perf_counter()
    load_1m = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    try:
        backends = select_backends(args.backends)
    except ValueError as exc:
        print(f"attnbench run: error: {exc}", file=sys.stderr)
        return 2
    record = machine_record()
    peaks = {np.dtype(dtype).name: gemm_peak_gflops(dtype) for dtype in (np.float32, np.float64)}
    lines = summary_lines(record)
    lines.append("GEMM peak  " + ", ".join(f"{name} {peak:.1f} GFLOP/s (numpy matmul, n=1024)"
                                             for name, peak in peaks.items()))
    busy = load_1m > 0.5 * (record["usable_cores"] or 1)
    lines.append(f"Load       {load_1m:.2f} (1-min average before the run)" + (
        ": the machine was busy, timings may be noisy" if busy else ""))
    print("\n".join(lines))
    n_shapes = len(GRIDS[args.grid])
    print(f"\nGrid '{args.grid}': {n_shapes} shape{'s' * (n_shapes != 1)} x "
          f"{len(MASK_KINDS)} mask kinds x 2 dtypes, backends {', '.join(backends)}\n",
          flush=True)

    table = agreement_table(args.grid, backends=backends, max_time=args.max_time,
                            gemm_peaks=peaks)
    print(_format_table(table))

    failed = table[~table["ok"]]
    for row in failed[failed["error"] != ""].itertuples():
        print(f"\n{row.backend} on {row.case} / {row.mask} / {row.dtype} raised: {row.error}")
    args.out.mkdir(parents=True, exist_ok=True)
    csv_path = args.out / "agreement.csv"
    table.to_csv(csv_path, index=False)
    elapsed = time.perf_counter() - start
    machine_path = args.out / "machine.json"
    machine_path.write_text(json.dumps(
        {**record, "gemm_peak_gflops": peaks, "load_average_1m": load_1m,
         "run_seconds": elapsed}, indent=2) + "\n")
    print(f"\n{len(table) - len(failed)}/{len(table)} rows agree with the reference. "
          f"Wrote {csv_path} and {machine_path} in {elapsed:.1f} s.")
    return 0 if failed.empty else 1


def _add_verify(subparsers) -> None:
    parser = subparsers.add_parser(
        "verify", help="check every claim of the source articles: the claims ledger",
        description=(
            "Run the claims ledger: each claim C01-C31 of the source articles is measured "
            "or computed and gets a verdict decided from the numbers (holds, "
            "holds-with-caveat with its condition, or does-not-hold). Prints one block per "
            "claim with the measured values, or a JSON list with --json. A few seconds on 2 "
            "cores; the timing claims (C12, C27, C29) depend on machine load. Exit status: "
            "0 if every check ran (whatever the verdicts), 1 if a check raised, 2 for an "
            "unknown claim id."),
    )
    parser.add_argument("--only", nargs="+", metavar="ID",
                        help="check only these claims, e.g. --only C03 C23 (default: all)")
    parser.add_argument("--json", action="store_true",
                        help="print a JSON list of objects (id, claim, source, verdict, "
                             "measured, condition, details, seconds, values)")
    parser.add_argument("--details", action="store_true",
                        help="also print how each claim was measured")
    parser.set_defaults(handler=_verify)


def _verify(args) -> int:
    from .claims import command

    return command(args)


def _add_params(subparsers) -> None:
    parser = subparsers.add_parser(
        "params", help="parameter counts of named or custom Transformer configurations",
        description=(
            "Count parameters from formulas, by group: attention (W_Q, W_K, W_V, W_O and "
            "biases), MLP, norms, embeddings (token + position + token type) and head "
            "(untied LM head, BERT pooler), with each model's published total and the "
            "difference, and the attention count checked against a real "
            "kernels.MultiHeadAttention where it fits in memory. Named configurations: "
            "bert-base, bert-large, gpt2-small, gpt3-175b, llama2-70b, tinyllama-1.1b. A "
            "custom configuration takes --d-model, --layers, --heads, --d-ff and --vocab "
            "(and optionally the others); it follows GPT-2's layout (biases, LayerNorm, "
            "GELU MLP, learned positions, tied head) unless told otherwise. With no "
            "argument, every named configuration. Exit status: 0, or 2 for a bad "
            "configuration."),
    )
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help="named configurations, e.g. bert-base gpt3-175b")
    parser.add_argument("--all", action="store_true", help="every named configuration")
    custom = parser.add_argument_group("custom configuration")
    for flag, help_text in (("--d-model", "model width"), ("--layers", "Transformer blocks"),
                            ("--heads", "query heads"),
                            ("--kv-heads", "key/value heads (GQA; default: --heads)"),
                            ("--d-ff", "MLP hidden width"), ("--vocab", "vocabulary size"),
                            ("--max-len", "learned positions (0: none, e.g. RoPE; default 0)"),
                            ("--type-vocab", "token-type embeddings (BERT: 2; default 0)")):
        custom.add_argument(flag, type=int, metavar="N", help=help_text)
    custom.add_argument("--mlp", choices=("gelu", "swiglu"),
                        help="gelu: 2 matrices with biases (default); swiglu: 3 matrices")
    custom.add_argument("--norm", choices=("layernorm", "rmsnorm"),
                        help="layernorm: weight + bias (default); rmsnorm: weight only")
    custom.add_argument("--no-bias", action="store_true",
                        help="no biases on the attention and MLP projections")
    custom.add_argument("--untied-head", action="store_true",
                        help="an LM head of its own (vocab x d_model)")
    custom.add_argument("--name", default="custom", help="row label (default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="print the table as JSON")
    parser.add_argument("--csv", metavar="FILE", type=Path, help="also write the table here")
    parser.set_defaults(handler=_params)


def _params(args) -> int:
    from .params import command

    return command(args)


#: Subcommands: name -> function adding its parser.  Later: sweep, report, bench.
COMMANDS = {"run": _add_run, "verify": _add_verify, "params": _add_params}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``attnbench`` command, with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="attnbench",
        description="Measure and verify the attention kernels of the kernels package.",
    )
    parser.add_argument("--version", action="version", version=f"attnbench {__version__}")
    subparsers = parser.add_subparsers(title="commands", dest="command", metavar="COMMAND",
                                       required=True)
    for add in COMMANDS.values():
        add(subparsers)
    return parser


def main(argv=None) -> int:
    """Entry point of ``attnbench``: parse ``argv`` (default ``sys.argv[1:]``), run, return status.

    Parameters
    ----------
    argv : list of str, optional

    Returns
    -------
    int
        The exit status (see each command's ``--help``).
    """
    args = build_parser().parse_args(argv)
    return args.handler(args)
