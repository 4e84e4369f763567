"""``attnbench bench``: the numba backend against its peers, side by side, in one process.

Every comparison is made on the same inputs, in the same
process, with the same thread count, and timed in interleaved rounds: each round calls
every implementation once (a batch of calls for short ones), so a burst of load from
another process hits all of them alike.  A timing is the median of its rounds, with the
interquartile range; ratios are ratios of medians.

Implementations:

- ``numba``: :func:`kernels.attention` with ``backend="numba"`` (validation included);
- ``torch``: PyTorch's ``scaled_dot_product_attention`` on the CPU
  (:mod:`attnbench.measure.peers`), with ``torch.set_num_threads`` equal to Numba's threads;
- ``numpy``: the plain formula in NumPy, in the input dtype (:mod:`attnbench.measure.peers`),
  its BLAS held to the same thread count;
- ``gemm floor`` (non-causal shapes): the numba kernel's two tile GEMMs alone, same tiles
  and tasks, no softmax (:mod:`attnbench.bench.gemm_floor`): the time the kernel would take if
  its softmax were free, so its ratio to a peer is the lowest ratio the kernel can reach.

A peer that is not installed is reported as missing (a row with that status), not
dropped.  torch is imported before Numba's OpenMP threading layer starts: imported
after it, then given ``torch.set_num_threads``, torch's SDPA runs about five times
slower (Numba's omp layer and torch's OpenMP runtime contend), which would flatter
numba.  Sections of the table (column ``section``; ``--only`` runs some):

- ``speed``: B=1, H=12, D=64, every L, causal and not: time, GFLOP/s (visible pairs,
  :mod:`attnbench.measure.flops`), % of the float32 GEMM peak measured in this run
  (:func:`attnbench.measure.machine.gemm_peak_gflops`, the larger of a measurement before and
  after the timings), numba / torch and numba / numpy, and the error of each against
  the oracle (:mod:`attnbench.measure.oracle`) on the last ``error_rows`` queries of head 0
  (rows are independent, so the oracle never needs the whole L x L problem);
- ``peak``: the same, non-causal, for the other head sizes (D=128) at L >= 2048;
- ``float64``: float64 beside float32 (no target);
- ``memory``: peak memory of one numba call beyond its inputs and output at L=16384, by
  tracemalloc (what NumPy and Numba allocate, the output subtracted), and the rise of the
  resident set size during the call as a cross-check (every allocator, the BLAS's buffers
  included; it counts the output only where it needed new pages);
- ``tiny``: latency of a tiny call (L=64, H=1, D=64), numba against torch;
- ``causal``: numba causal against non-causal at L >= ``peak_min_length``, interleaved
  (the causal speed-up target);
- ``padding``: numba with half the keys padded through ``key_lengths`` against none;
- ``parallel``: numba on 1 thread against all of them;
- ``backward``: the numba backward (``out`` and ``lse`` given) against torch's autograd
  through SDPA, and against numba's forward, causal and not, at ``backward_lengths``;
  the extra memory of one backward call (:mod:`attnbench.bench.backward`);
- ``variants``: sliding window, documents, ALiBi and softcap against the plain call
  (:mod:`attnbench.bench.variants`);
- ``varlen``: packed variable-length batches against the dense calls and the padded call,
  and sinks against the plain call (:mod:`attnbench.bench.varlen`);
- ``precision``: bfloat16 and float16 prefill and the bfloat16 backward against float32,
  and numba against torch SDPA in bfloat16 (:mod:`attnbench.bench.precision`);
- ``startup``: a new Python process, Numba's cache warm: ``import kernels`` and the first
  call (of the parallel kernel), timed inside the process; the whole process beside it.

:func:`attnbench.bench.targets.targets_table` turns the rows into one verdict per target;
:mod:`attnbench.bench.output` prints and writes them; :mod:`attnbench.bench.config` holds
what is measured.
"""


from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict

import numba
import numpy as np
import pandas as pd

from attnbench.bench.backward import backward_section
from attnbench.bench.config import (
    COLUMNS,
    BenchConfig,
)
from attnbench.bench.decode import decode_section
from attnbench.bench.precision import precision_section
from attnbench.bench.sections import (
    causal_section,
    compare_section,
    memory_section,
    padding_section,
    parallel_section,
    startup_section,
    tiny_section,
)
from attnbench.bench.variants import variants_section
from attnbench.bench.varlen import varlen_section
from attnbench.measure import peers
from attnbench.measure.machine import (
    gemm_peak_gflops,
    machine_columns,
    machine_record,
    plan_ahead,
)
from attnbench.measure.problems import (
    limit_threads,
    load_average,
)
from attnbench.measure.timing import fault

# --- the run ----------------------------------------------------------------------------------


def _gemm_peaks() -> dict[str, float]:
    return {np.dtype(t).name: gemm_peak_gflops(t) for t in (np.float32, np.float64)}


def _timed_sections(config: BenchConfig, threads: int, peaks: dict,
                    progress: Callable[[str], None]) -> list[dict]:
    """The rows of every section of ``config.sections`` but start-up, in order."""
    run = set(config.sections)
    rows: list[dict] = []
    D, B, H = config.head_size, config.batch, config.heads
    for L in config.speed_lengths() if "speed" in run else ():
        for causal in config.causal:
            progress(f"speed   L={L} D={D} {'causal' if causal else 'non-causal'}")
            rows += compare_section("speed", config, B=B, H=H, L=L, D=D, causal=causal,
                                    dtype=np.float32, threads=threads, peaks=peaks)
    for D_peak in config.peak_head_sizes if "peak" in run else ():
        if D_peak == config.head_size and False in config.causal and "speed" in run:
            continue  # measured by the speed section
        for L in config.speed_lengths():
            if L >= config.peak_min_length:
                progress(f"peak    L={L} D={D_peak} non-causal")
                rows += compare_section("peak", config, B=B, H=H, L=L, D=D_peak, causal=False,
                                        dtype=np.float32, threads=threads, peaks=peaks,
                                        impls=("numba", "torch"))
    for L in config.float64_lengths if "float64" in run else ():
        for causal in config.causal:
            progress(f"float64 L={L} {'causal' if causal else 'non-causal'}")
            rows += compare_section("float64", config, B=B, H=H, L=L, D=D, causal=causal,
                                    dtype=np.float64, threads=threads, peaks=peaks)
    if "memory" in run:
        progress(f"memory  L={config.memory_length}")
        rows += memory_section(config, threads)
    if "tiny" in run:
        progress(f"tiny    L={config.tiny_length} H=1")
        rows += tiny_section(config, threads)
    if "causal" in run and True in config.causal and False in config.causal:
        progress(f"causal  numba causal vs non-causal, L >= {config.peak_min_length}")
        rows += causal_section(config, threads, peaks)
    if "padding" in run:
        progress(f"padding L={config.padding_length}")
        rows += padding_section(config, threads, peaks)
    if "parallel" in run:
        progress(f"parallel L={config.parallel_length}: 1 vs {threads} threads")
        rows += parallel_section(config, threads, peaks)
    if "backward" in run and config.backward_lengths:
        rows += backward_section(config, threads, progress)
    if "variants" in run:
        rows += variants_section(config, threads, progress)
    if "decode" in run:
        rows += decode_section(config, threads, progress)
    if "varlen" in run:
        rows += varlen_section(config, threads, progress)
    if "precision" in run:
        rows += precision_section(config, threads, progress)
    return rows


def planned_shapes(config: BenchConfig):
    """The largest numba forward problems of the bench, per dtype, for
    :func:`attnbench.measure.machine.plan_ahead`."""
    B, H, D = config.batch, config.heads, config.head_size
    for dtype, lengths in (("float32", config.lengths + (config.padding_length,
                                                         config.parallel_length)),
                           ("float64", config.float64_lengths)):
        if lengths:
            L = max(lengths)
            yield "numba", (B, H, L, L, D, D), dtype


def run_bench(config: BenchConfig | None = None, *,
              progress: Callable[[str], None] = print) -> tuple[pd.DataFrame, dict]:
    """Run every section of the bench; returns ``(table, meta)``.

    Parameters
    ----------
    config : BenchConfig
    progress : callable
        Called with a line of text as each part starts (``print`` by default).

    Returns
    -------
    table : DataFrame
        One row per (section, implementation, shape, variant): :data:`COLUMNS`, then the
        machine columns (:func:`attnbench.measure.machine.machine_columns`) and the GEMM peaks.
    meta : dict
        ``config``, ``gemm_peak_gflops`` (before and after the timings, and the one used),
        ``machine`` (:func:`attnbench.measure.machine.machine_record`), ``seconds``,
        ``load_average``.
    """
    config = BenchConfig() if config is None else config

    if "torch" in config.peers:
        peers.peer_status("torch")  # import torch before Numba's threads start: see below
    threads = config.threads or numba.get_num_threads()
    started = time.perf_counter()
    plan_ahead(planned_shapes(config))  # no timed call plans: see plan_ahead
    load_before = load_average()
    rows: list[dict] = []
    with limit_threads(threads, torch="torch" in config.peers):
        progress(f"GEMM peak (numpy matmul, {threads} threads) ...")
        before = _gemm_peaks()
        peaks = dict(before)
        rows += _timed_sections(config, threads, peaks, progress)
        after = _gemm_peaks()
    if "startup" in config.sections:
        progress("startup (fresh processes) ...")
        rows += startup_section(config, threads)

    used = {name: max(before[name], after[name]) for name in before}
    table = pd.DataFrame(rows, columns=list(COLUMNS))
    for name, peak in used.items():  # % of the peak against the larger measurement
        dtype_rows = table["dtype"] == name
        table.loc[dtype_rows, "pct_of_gemm_peak"] = 100 * table.loc[dtype_rows, "gflops"] / peak
    impossible = table["pct_of_gemm_peak"] > 100  # never a result: a measurement fault
    table["fault"] = [fault(pct, 100, "% of the GEMM peak") if bad else ""
                      for pct, bad in zip(table["pct_of_gemm_peak"], impossible, strict=True)]
    table.loc[impossible, "pct_of_gemm_peak"] = np.nan
    record = machine_record()
    record["numba_threads"] = threads
    for column, value in machine_columns(record).items():
        table[column] = value
    table["gemm_peak_gflops"] = table["dtype"].map(used)
    meta = {"config": asdict(config), "threads": threads,
            "gemm_peak_gflops": {"before": before, "after": after, "used": used},
            "machine": record, "seconds": time.perf_counter() - started,
            "load_average": [load_before, load_average()]}
    return table, meta
