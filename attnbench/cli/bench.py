"""The ``bench`` command: the numba backend against torch SDPA and plain NumPy, side by side.

:func:`add_bench` declares the arguments; :func:`bench_command` turns them into a
:class:`~attnbench.bench.config.BenchConfig`, runs the sections
(:func:`attnbench.bench.run.run_bench`), prints the table and one verdict per target
(:func:`attnbench.bench.targets.targets_table`) and writes the files
(:mod:`attnbench.bench.output`).  torch is imported and the kernels' tiles are planned
before the machine header is printed, so that the header says what the timings ran on.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from attnbench.bench.config import SECTIONS, command_line, config_from_args
from attnbench.bench.output import format_table, format_targets, write_results
from attnbench.bench.run import planned_shapes, run_bench
from attnbench.bench.targets import targets_table
from attnbench.cli.arguments import peer_name, positive_int
from attnbench.measure import peers
from attnbench.measure.machine import plan_ahead, summary_lines

__all__ = ["add_bench", "bench_command"]


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
    parser.set_defaults(handler=bench_command)


def bench_command(args) -> int:
    """``attnbench bench``: run, print the tables, write the files; the exit status.

    0 when every numba row ran and is within the tolerance (targets met or not: they are
    measurements, reported in the table), 1 otherwise.
    """
    config = config_from_args(args)
    if "torch" in config.peers:
        peers.peer_status("torch")  # before summary_lines starts Numba's threads
    plan_ahead(planned_shapes(config))  # before the header, so its "Tiles" line is true
    print("\n".join(summary_lines()), flush=True)
    table, meta = run_bench(config, progress=lambda line: print(line, file=sys.stderr,
                                                                flush=True))
    targets = targets_table(table, config)
    peaks = meta["gemm_peak_gflops"]["used"]
    print(f"GEMM peak  float32 {peaks['float32']:.1f} GFLOP/s, float64 {peaks['float64']:.1f} "
          f"GFLOP/s (numpy matmul n=1024, {meta['threads']} threads, larger of before/after)")
    print(f"Load       {meta['load_average'][0]:.2f} before, {meta['load_average'][1]:.2f} after"
          f" (1-min average; {os.cpu_count()} logical cores)\n")
    print(format_table(table))
    print("\n" + format_targets(targets))
    paths = write_results(table, targets, meta, args.out, command_line=command_line(config))
    print(f"\nWrote {', '.join(str(path) for path in paths)} in {meta['seconds']:.0f} s.")
    numba_rows = table[table["impl"] == "numba"]
    failed = (~numba_rows["status"].isin(["ok"])
              & ~numba_rows["status"].str.startswith("skipped")).any()
    inaccurate = (numba_rows["within_tolerance"].dropna() == False).any()  # noqa: E712
    return 1 if failed or inaccurate else 0
