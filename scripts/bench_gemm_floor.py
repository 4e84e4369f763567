"""The GEMM floor, measured: BLAS tiles against a register-blocked micro-kernel.

Side by side, interleaved (:func:`attnbench.measure.timing.interleaved`: every round times
each function once, in a rotating order, warm-up and calibration excluded), per point:

- ``numba``: the numba backend on its BLAS tiles (:func:`kernels.numba_cpu.choose.run`, parallel,
  ``micro=False``: the backend where the planner chose "blas" or nothing is planned);
- ``micro``: the micro-kernel path (:mod:`kernels.numba_cpu.micro`; the backend where the
  planner chose it), register block chosen by its planner (:func:`kernels.numba_cpu.planner.plan`:
  timed once per machine and dtype, persisted);
- ``floor``: the numba backend's BLAS tile GEMMs alone
  (:func:`attnbench.bench.gemm_floor.tile_gemms`; non-causal only);
- ``torch``: PyTorch's SDPA on the CPU (where installed), same threads.

For B=1, H=12, D=64 (default), L in {1024, 2048, 4096}, causal and not, float32 and
float64, 1 and 2 threads.  Each point prints medians with their 95% intervals and the
ratios of medians with bootstrap intervals (for 1 thread also the ratios of the calling
thread's CPU time, ``... cpu``: the work, unaffected by other processes).  ``--json``
writes every sample, the machine record (CPU model, BLAS by threadpoolctl), Numba's
target CPU name and features and the planner's choices.  The micro-kernel's output is
checked against the numba backend's at every point (max abs difference, in the JSON).

Usage::

    .venv/bin/python scripts/bench_gemm_floor.py --json gemm-floor.json
    .venv/bin/python scripts/bench_gemm_floor.py --lengths 1024 --threads 1 --rounds 6
    .venv/bin/python scripts/bench_gemm_floor.py --from-json a.json b.json   # one table
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys

import numba
import numpy as np

from attnbench import kernels
from attnbench.bench import gemm_floor
from attnbench.kernels.numba_cpu import choose
from attnbench.kernels.numba_cpu import micro as _microkernel
from attnbench.kernels.numba_cpu import planner as _microplan
from attnbench.measure import machine, peers
from attnbench.measure.intervals import ratio_interval
from attnbench.measure.timing import interleaved

#: Ratios reported per point: (name, numerator, denominator).
RATIOS = (("micro/numba", "micro", "numba"), ("numba/floor", "numba", "floor"),
          ("micro/floor", "micro", "floor"), ("numba/torch", "numba", "torch"),
          ("micro/torch", "micro", "torch"))


def numba_target() -> dict:
    """The CPU name and features Numba compiles for (overrides from the environment first)."""
    from llvmlite import binding as llvm

    return {"NUMBA_CPU_NAME": numba.config.CPU_NAME,
            "NUMBA_CPU_FEATURES": numba.config.CPU_FEATURES,
            "llvm_host_cpu": llvm.get_host_cpu_name(),
            "llvm_host_features": llvm.get_host_cpu_features().flatten()}


def calls(L: int, causal: bool, dtype, heads: int, head_dim: int, config) -> tuple[dict, float]:
    """The functions timed at one point, and the micro-kernel's max difference from numba."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, heads, L, head_dim)).astype(dtype) for _ in range(3))
    problem = kernels.prepare(q, k, v, causal=causal)
    fns = {
        "numba": lambda: choose.run(problem, parallel=True, micro=False)[0],
        "micro": lambda: _microkernel.attention(q, k, v, causal=causal, config=config),
    }
    if not causal and gemm_floor.measurable(q, k, v):
        fns["floor"] = gemm_floor.tile_gemms_call(q, k, v)
    if importlib.util.find_spec("torch") is not None:
        fns["torch"] = peers.make_call("torch", q, k, v, {"causal": causal})
    diff = float(np.max(np.abs(fns["micro"]() - fns["numba"]())))
    return fns, diff


def set_threads(n: int) -> None:
    """Numba's threads (numba, micro, floor) and torch's own pool to ``n``."""
    numba.set_num_threads(n)
    if importlib.util.find_spec("torch") is not None:
        import torch

        torch.set_num_threads(n)


def measure_point(L, causal, dtype, threads, args, config) -> dict:
    """Time one point interleaved; return its medians, intervals, ratios and samples."""
    set_threads(threads)
    fns, diff = calls(L, causal, dtype, args.heads, args.head_dim, config)
    timings = interleaved(fns, rounds=args.rounds, warmup=1, min_time=args.min_time)
    row = {"L": L, "causal": causal, "dtype": np.dtype(dtype).name, "threads": threads,
           "micro_config": list(config), "micro_vs_numba_max_abs_diff": diff}
    for name, t in timings.items():
        low, high = t.ci95
        row[name] = {"median_ms": t.median * 1e3, "ci_ms": [low * 1e3, high * 1e3],
                     "runs": t.runs, "number": t.number,
                     "samples_ms": [s * 1e3 for s in t.samples],
                     "thread_cpu_ms": [s * 1e3 for s in t.thread_samples],
                     "process_cpu_ms": [s * 1e3 for s in t.cpu_samples]}
    for label, top, bottom in RATIOS:
        if top in timings and bottom in timings:
            row[label] = list(ratio_interval(timings[top].samples, timings[bottom].samples))
            if threads == 1:  # all the work is on the calling thread: its CPU time is the
                # work, whatever else the machine runs (robust on a loaded machine)
                row[label + " cpu"] = list(ratio_interval(timings[top].thread_samples,
                                                          timings[bottom].thread_samples))
    return row


def _cell(row, name) -> str:
    if name not in row:
        return "–"
    if "median_ms" in row[name]:
        low, high = row[name]["ci_ms"]
        return f"{row[name]['median_ms']:.1f} [{low:.1f}, {high:.1f}]"
    ratio, low, high = row[name]
    return f"{ratio:.2f} [{low:.2f}, {high:.2f}]"


def table(rows: list[dict]) -> str:
    """The points as a Markdown table: medians (ms) and ratios, each with its 95% interval."""
    names = (["numba", "micro", "floor", "torch"] + [label for label, _, _ in RATIOS]
             + [label + " cpu" for label, _, _ in RATIOS[:3]])  # all of them in the JSON
    head = (["dtype", "block", "thr", "L", "causal"]
            + [f"{n} ms" if "/" not in n else n for n in names])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row["dtype"], "x".join(map(str, row["micro_config"])), str(row["threads"]),
                 str(row["L"]), "yes" if row["causal"] else "no"]
        lines.append("| " + " | ".join(cells + [_cell(row, n) for n in names]) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float64"])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7,
                        help="interleaved rounds per point (an interval needs 6 or more)")
    parser.add_argument("--min-time", type=float, default=0.05,
                        help="seconds a timed batch lasts at least (calibration)")
    parser.add_argument("--config", nargs="*", default=[], metavar="DTYPE:MRxNR",
                        help="register block to use instead of planning, e.g. float32:8x16")
    parser.add_argument("--json", help="write every sample and the machine record here")
    parser.add_argument("--from-json", nargs="+", metavar="FILE",
                        help="print the table of earlier --json files (in order) and exit")
    args = parser.parse_args(argv)
    if args.from_json:
        rows = []
        for path in args.from_json:
            with open(path) as f:
                rows += json.load(f)["rows"]
        print(table(rows))
        return 0
    causal = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    record = machine.machine_record()
    info = {"machine": record, "numba_target": numba_target(),
            "blocks": {"block_q": _microkernel.BLOCK_Q, "block_k": _microkernel.BLOCK_K}}
    for line in machine.summary_lines(record):
        print(line)
    target = info["numba_target"]
    print(f"Numba CPU  {target['NUMBA_CPU_NAME'] or target['llvm_host_cpu']} "
          f"(features: {target['NUMBA_CPU_FEATURES'] or 'host'})", flush=True)
    given = dict(item.split(":") for item in args.config)
    plans = {name: tuple(int(n) for n in given[name].split("x")) if name in given
             else _microplan.plan(name) for name in args.dtypes}
    info["plans"] = {name: list(config) for name, config in plans.items()}
    print(f"Planner    {info['plans']}", flush=True)
    rows = []
    for threads in args.threads:
        for dtype in args.dtypes:
            for is_causal in causal:
                for L in args.lengths:
                    rows.append(measure_point(L, is_causal, np.dtype(dtype), threads, args,
                                              plans[dtype]))
                    print(table(rows[-1:]).splitlines()[-1], flush=True)
                    if args.json:  # after every point: a stopped run keeps what it measured
                        with open(args.json, "w") as f:
                            json.dump({"info": info, "rows": rows}, f, indent=1)
    print()
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
