"""The subcommands that measure: ``run`` (the main job), ``sweep`` and ``bench``.

Each is a ``add_<name>`` function declaring its arguments; the work is done by the
function its parser's ``handler`` names.
"""

from __future__ import annotations

from pathlib import Path

from attnbench.bench import run as bench_run
from attnbench.bench.config import SECTIONS
from attnbench.cli.arguments import backend_name, cluster_spec, peer_name, positive_int, variant
from attnbench.job import run_command, sweep_command
from attnbench.sweep.grid import (
    BACKENDS,
    DEFAULTS,
    DIRECTIONS,
    DTYPES,
    GRIDS,
    KINDS,
    MASK_KINDS,
)
from attnbench.sweep.runner import ORACLE_LIMIT

__all__ = ["add_bench", "add_run", "add_sweep"]


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
    parser.set_defaults(handler=_run)


def _run(args) -> int:
    return run_command(args)


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
    parser.set_defaults(handler=_sweep)


def _sweep(args) -> int:
    return sweep_command(args)


def add_bench(subparsers) -> None:
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
    parser.add_argument("--L", type=positive_int, nargs="+", metavar="N",
                        help="sequence lengths (default: 512 1024 2048 4096 8192)")
    parser.add_argument("--D", type=positive_int, nargs="+", metavar="N",
                        help="head sizes: the first for the speed table, all for the GEMM-peak "
                             "check (default: 64 128)")
    parser.add_argument("--causal", choices=("both", "yes", "no"), default="both",
                        help="causal, non-causal or both (default: %(default)s)")
    parser.add_argument("--quick", action="store_true",
                        help="smaller shapes (L 256-1024, memory at L=2048), 3 rounds")
    parser.add_argument("--rounds", type=positive_int, metavar="N",
                        help="interleaved timing rounds per shape (default: 5; --quick 3)")
    parser.add_argument("--threads", type=positive_int, metavar="N",
                        help="threads for Numba, torch and the BLAS (default: Numba's)")
    parser.add_argument("--peers", nargs="*", type=peer_name, metavar="NAME",
                        help="peers to compare with, from torch, numpy, or any implementation "
                             "as 'attnbench conform' names it (module:function, or a name "
                             "another package registered under attnbench.implementations), "
                             "timed in the speed and float64 tables (default: torch numpy)")
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
            ("--score-L", "score_length", "L of the ALiBi and softcap variants", 4096),
            ("--window-backward-L", "window_backward_length",
             "L of the backward with the sliding window", 8192),
            ("--decode-L", "decode_length", "cache of the decode section's B=1 points", 32768),
            ("--decode-batch-L", "decode_batch_length", "cache of its B=8 point", 4096),
            ("--decode-mqa-L", "decode_mqa_length", "cache of its MQA splits point", 65536)):
        parser.add_argument(flag, dest=dest, type=positive_int, metavar="N",
                            help=f"{what} (default: {default}; --quick: smaller)")
    parser.add_argument("--float64-L", dest="float64_L", type=positive_int, nargs="*",
                        metavar="N", help="L of the float64 rows (default: 1024; none: off)")
    parser.add_argument("--backward-L", dest="backward_L", type=positive_int, nargs="*",
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
