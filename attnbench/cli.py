"""The ``attnbench`` command (also ``python -m attnbench``).

One subcommand per task, each a ``_add_<name>`` function that declares its arguments
and a ``_<name>`` function that runs it and returns the exit code; :data:`COMMANDS`
lists them: ``run`` (the main job), ``sweep`` and ``report``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnbench import __version__
from attnbench.bench import run as bench_run
from attnbench.bench.config import SECTIONS
from attnbench.claims import ledger
from attnbench.job import run_command, sweep_command
from attnbench.report import build as report_build
from attnbench.studies import params
from attnbench.sweep.cluster import parse_cluster
from attnbench.sweep.grid import (
    BACKENDS,
    DEFAULTS,
    DIRECTIONS,
    DTYPES,
    GRIDS,
    MASK_KINDS,
    check_variant,
)
from attnbench.sweep.runner import ORACLE_LIMIT


def _add_run(subparsers) -> None:
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
            "1024-4096 and 8 equal documents for numba; about 80 s on 2 quiet cores "
            "before the backward and variant points, which add about 0.6x that and ~20 s "
            "compiling the two mask functions) into "
            "OUT/sweep.csv, sweep.parquet and sweep.json, fit the scaling exponents "
            "(OUT/scaling.csv), compute the attention heat maps and the studies of "
            "softmax stability, parameter arithmetic and the claims ledger "
            "(OUT/sections/), and render OUT/report.html from those files. "
            "Measured on 2 shared cores (load 5-8): the whole job 189 s with Numba's "
            "compile cache warm, 501 s the first time (empty cache: the kernels compile), "
            "before the backward and variant points; with them, 797 s at load 10-14. "
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
    parser.add_argument("--threads", metavar="N", type=_positive_int,
                        help="run the sweep (and its GEMM peak) on at most N threads: "
                             "Numba, BLAS, OpenMP, torch; 1 gives steadier scaling fits on "
                             "a shared machine (default: all)")
    parser.set_defaults(handler=_run)


def _run(args) -> int:
    return run_command(args)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _add_sweep(subparsers) -> None:
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
        ("--L", "L", {"type": _positive_int, "metavar": "N", "help": "sequence lengths"}),
        ("--dk", "dk", {"type": _positive_int, "metavar": "N", "help": "head sizes d_k"}),
        ("--heads", "heads", {"type": _positive_int, "metavar": "N", "help": "query heads"}),
        ("--kv-heads", "kv_heads", {"type": _positive_int, "metavar": "N",
                                    "help": "key/value heads, for GQA"}),
        ("--batch", "batch", {"type": _positive_int, "metavar": "N", "help": "batch sizes"}),
        ("--mask", "mask", {"choices": MASK_KINDS, "metavar": "KIND",
                            "help": f"mask kinds, from {', '.join(MASK_KINDS)}"}),
        ("--dtype", "dtype", {"choices": DTYPES, "metavar": "DTYPE",
                              "help": f"dtypes, from {', '.join(DTYPES)}"}),
        ("--backend", "backend", {"choices": BACKENDS, "metavar": "NAME",
                                  "help": f"backends, from {', '.join(BACKENDS)}"}),
        ("--direction", "direction", {
            "choices": DIRECTIONS, "metavar": "DIR",
            "help": "forward (time attention) and/or backward (time attention_backward "
                    "given the forward's out and lse; torch through autograd, numpy has "
                    "none)"}),
        ("--variant", "variant", {
            "type": _variant, "metavar": "NAME",
            "help": "attention variants (kernels.mods): none, window-W (causal sliding "
                    "window, keys i-W..i), documents-N (N equal documents), alibi, softcap "
                    "(cap 30); FLOPs count only visible pairs"}),
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
    parser.add_argument("--oracle-limit", metavar="N", type=_positive_int,
                        default=ORACLE_LIMIT,
                        help="largest problem (score entries B*H*L^2) whose error against "
                             "the oracle is computed; a quarter of it for float64 "
                             "(default: %(default)s)")
    parser.add_argument("--memory-budget", metavar="GB", type=float,
                        help="skip points whose L x L arrays would need more (default: half "
                             "of the available memory)")
    parser.add_argument("--threads", metavar="N", type=_positive_int,
                        help="at most N threads for Numba, BLAS, OpenMP and torch, GEMM peak "
                             "included; 1 gives steadier scaling fits on a shared machine "
                             "(default: all)")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar on stderr")
    parser.add_argument("--cluster", metavar="SPEC", type=_cluster_spec,
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
    parser.set_defaults(handler=_sweep)


def _variant(text: str) -> str:
    try:
        return check_variant(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _cluster_spec(text: str):
    try:
        return parse_cluster(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _sweep(args) -> int:
    return sweep_command(args)


def _add_report(subparsers) -> None:
    parser = subparsers.add_parser(
        "report", help="rebuild the HTML report from saved results, without re-running",
        description=(
            "Render FOLDER/report.html from the files 'attnbench run' or 'attnbench sweep' "
            "wrote there: agreement.csv, sweep.parquet or sweep.csv (the scaling fits are "
            "recomputed from its rows), sections/ (heat maps and studies as they were "
            "computed) and machine.json. Nothing is measured again. Prints which command "
            "wrote each file it read (the page's subtitle says it too); a few seconds. "
            "Exit status: 0, or 2 if FOLDER holds no results."),
    )
    parser.add_argument("folder", metavar="FOLDER", type=Path, nargs="?",
                        default=Path("reports"),
                        help="the results folder (default: %(default)s)")
    parser.add_argument("--html", metavar="FILE", type=Path,
                        help="where to write the page (default: FOLDER/report.html)")
    parser.set_defaults(handler=_report)


def _report(args) -> int:
    return report_build.command(args)


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
    return ledger.command(args)


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
    return params.command(args)


def _add_bench(subparsers) -> None:
    parser = subparsers.add_parser(
        "bench", help="the numba backend against torch SDPA and plain NumPy, side by side",
        description=(
            "The performance table in one process: numba, torch SDPA (torch.set_num_threads = "
            "Numba's threads) and a plain NumPy implementation on the same inputs, timed in "
            "interleaved rounds (medians, IQR, ratios of medians), with GFLOP/s and % of the "
            "float32 GEMM peak measured in the same run, the error of each against the "
            "oracle, and further checks: peak extra memory at --memory-L, tiny-call latency, "
            "key_lengths with half the keys padded, 1 thread against all, the backward pass "
            "against torch's autograd, the score and mask variants against the plain call, "
            "start-up of a new process with a warm cache. On non-causal shapes the numba "
            "kernel's tile GEMMs alone (no softmax) are timed beside it: the floor under its "
            "time. Peers that are not installed are reported as missing. Prints the table "
            "and one verdict per target (the backward's and the variants' from the 95% "
            "interval of each ratio: met, missed or inconclusive), writes OUT/bench.csv, "
            "targets.csv, machine.json, bench.png, bench.html and bench.md. About 7 minutes "
            "on 2 cores without the backward and variants sections, which add several more "
            "(--quick: a few minutes in all). Exit status: 0 if numba ran everywhere within the "
            "tolerance (targets met or not), 1 otherwise."),
    )
    parser.add_argument("--L", type=_positive_int, nargs="+", metavar="N",
                        help="sequence lengths (default: 512 1024 2048 4096 8192)")
    parser.add_argument("--D", type=_positive_int, nargs="+", metavar="N",
                        help="head sizes: the first for the speed table, all for the GEMM-peak "
                             "check (default: 64 128)")
    parser.add_argument("--causal", choices=("both", "yes", "no"), default="both",
                        help="causal, non-causal or both (default: %(default)s)")
    parser.add_argument("--quick", action="store_true",
                        help="smaller shapes (L 256-1024, memory at L=2048), 3 rounds")
    parser.add_argument("--rounds", type=_positive_int, metavar="N",
                        help="interleaved timing rounds per shape (default: 5; --quick 3)")
    parser.add_argument("--threads", type=_positive_int, metavar="N",
                        help="threads for Numba, torch and the BLAS (default: Numba's)")
    parser.add_argument("--peers", nargs="*", choices=("torch", "numpy"), metavar="NAME",
                        help="peers to compare with, from torch, numpy (default: both)")
    for flag, dest, what, default in (
            ("--peak-min-L", "peak_min_length", "smallest L of the GEMM-peak check", 2048),
            ("--memory-L", "memory_length", "L of the memory check", 16384),
            ("--tiny-L", "tiny_length", "L of the tiny call (H=1)", 64),
            ("--padding-L", "padding_length", "L of the key_lengths check", 4096),
            ("--parallel-L", "parallel_length", "L of the 1-thread check", 4096),
            ("--backward-memory-L", "backward_memory_length",
             "L of the backward's memory check", 16384),
            ("--window-L", "window_length", "L of the sliding-window variant", 16384),
            ("--documents-L", "documents_length", "L of the 8-documents variant", 8192),
            ("--score-L", "score_length", "L of the ALiBi and softcap variants", 4096)):
        parser.add_argument(flag, dest=dest, type=_positive_int, metavar="N",
                            help=f"{what} (default: {default}; --quick: smaller)")
    parser.add_argument("--float64-L", dest="float64_L", type=_positive_int, nargs="*",
                        metavar="N", help="L of the float64 rows (default: 1024; none: off)")
    parser.add_argument("--backward-L", dest="backward_L", type=_positive_int, nargs="*",
                        metavar="N", help="L of the backward rows (default: 1024 2048 4096)")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, metavar="SECTION",
                        help=f"run only these sections, from {', '.join(SECTIONS)} "
                             "(default: all)")
    parser.add_argument("--startup-runs", dest="startup_runs", type=int, metavar="N",
                        help="fresh processes timed for start-up (default: 3; 0: skip)")
    parser.add_argument("--numpy-max-gb", dest="numpy_max_gb", type=float, metavar="GB",
                        help="skip the NumPy peer where its L x L arrays need more (default: 6)")
    parser.add_argument("--out", metavar="DIR", type=Path, default=Path("reports/bench"),
                        help="folder for the results, created if missing (default: "
                             "%(default)s)")
    parser.set_defaults(handler=_bench)


def _bench(args) -> int:
    return bench_run.command(args)


def _add_compare(subparsers) -> None:
    parser = subparsers.add_parser(
        "compare", help="compare two result folders: ratios with intervals, CI exit status",
        description=(
            "Compare the sweeps of two result folders (two commits, two machines, before and "
            "after): for every point measured in both, the ratio of the medians B / A with a "
            "95%% bootstrap interval over the samples, and whether the change is significant "
            "(the whole interval on one side of 1). Writes OUT/compare.csv and compare.png. "
            "Exit status: 0, 1 if a point regressed (the whole interval above 1 + "
            "THRESHOLD), 2 if a folder holds no sweep or the two share no point."),
    )
    parser.add_argument("before", metavar="A", type=Path, help="the baseline results folder")
    parser.add_argument("after", metavar="B", type=Path, help="the results folder to judge")
    parser.add_argument("--threshold", type=float, default=0.10,
                        help="relative slow-down a significant change must exceed to be a "
                             "regression (default: %(default)s)")
    parser.add_argument("--quantity", choices=("time", "cpu"), default="time",
                        help="wall-clock time or process CPU time (default: %(default)s)")
    parser.add_argument("--out", type=Path,
                        help="where to write compare.csv and compare.png (default: B/compare)")
    parser.set_defaults(handler=_compare)


def _compare(args) -> int:
    from attnbench.compare import command

    return command(args)


#: Subcommands: name -> function adding its parser.
COMMANDS = {"run": _add_run, "sweep": _add_sweep, "report": _add_report,
            "verify": _add_verify, "params": _add_params, "bench": _add_bench,
            "compare": _add_compare}


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
        The exit status (see each command's ``--help``); 130 after Ctrl-C.
    """
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        # sweeps catch Ctrl-C themselves and keep their rows; elsewhere (the agreement
        # check, a study) a traceback would say nothing more than this line
        print(f"\nattnbench {args.command}: interrupted (Ctrl-C)", file=sys.stderr)
        return 130
