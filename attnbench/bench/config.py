"""What ``attnbench bench`` measures: its configuration, table columns and command line."""

from __future__ import annotations

from dataclasses import dataclass, replace

from attnbench.measure.intervals import MIN_INTERVAL_SAMPLES
from attnbench.measure.peers import PEERS

#: Implementations compared, in table order: the numba backend and the CPU peers.
IMPLS = ("numba", *PEERS)
#: The numba kernel's tile GEMMs alone (:mod:`attnbench.bench.gemm_floor`), timed beside it on
#: non-causal shapes: the floor under its time.
FLOOR = "gemm floor"
#: Columns of the bench table, in order (then the machine columns).
COLUMNS = (
    "section", "impl", "variant", "B", "H", "L", "D", "causal", "dtype", "threads", "status",
    "median_ms", "q25_ms", "q75_ms", "iqr_ms", "min_ms", "runs", "number", "calls",
    "samples_ms", "gflops",
    "pct_of_gemm_peak", "vs_torch", "vs_numpy", "max_abs_err", "tolerance", "within_tolerance",
    "extra_mib",
    "rss_extra_mib", "load_1m",
)
#: Sections of ``attnbench bench``, in the order they run (``--only`` picks some).
SECTIONS = ("speed", "peak", "float64", "memory", "tiny", "causal", "padding", "parallel",
            "backward", "variants", "decode", "varlen", "precision", "startup")
#: Columns of the targets table.
TARGET_COLUMNS = ("target", "shape", "measured", "goal", "met", "note")


@dataclass(frozen=True)
class BenchConfig:
    """What ``attnbench bench`` measures (the defaults are the full table of the README)."""

    lengths: tuple[int, ...] = (512, 1024, 2048, 4096, 8192)  # L of the speed section
    head_size: int = 64  # D of the speed section
    peak_head_sizes: tuple[int, ...] = (64, 128)  # D whose GEMM-peak fraction is checked
    peak_min_length: int = 2048  # ... at every L >= this (non-causal)
    heads: int = 12  # H of every section but tiny
    batch: int = 1  # B of every section
    causal: tuple[bool, ...] = (False, True)  # mask kinds of the speed section
    float64_lengths: tuple[int, ...] = (1024,)  # L of the float64 section (no target)
    rounds: int = 5  # interleaved timing rounds per shape
    min_time: float = 0.02  # shortest batch of calls (s): short calls are batched
    threads: int | None = None  # Numba, torch and BLAS threads; None: Numba's default
    memory_length: int = 16384  # L of the memory section
    tiny_length: int = 64  # L of the tiny-call section (H = 1)
    padding_length: int = 4096  # L of the padding section
    parallel_length: int = 4096  # L of the parallel-efficiency section
    startup_runs: int = 3  # fresh processes timed (after one that warms the cache)
    error_rows: int = 256  # queries of head 0 compared with the oracle
    numpy_max_gb: float = 6.0  # skip the numpy peer when its L x L arrays need more
    peers: tuple[str, ...] = ("torch", "numpy")  # peers compared with numba
    backward_lengths: tuple[int, ...] = (1024, 2048, 4096)  # L of the backward section
    backward_memory_length: int = 16384  # L of the backward's memory check
    window_length: int = 16384  # L of the sliding-window variant (left = window_left, causal)
    window_left: int = 256
    documents_length: int = 8192  # L of the documents variant (n_documents equal ones)
    n_documents: int = 8
    score_length: int = 4096  # L of the ALiBi and softcap variants
    window_backward_length: int = 8192  # L of the backward with the sliding window
    decode_length: int = 32768  # cache of the decode section's B=1 points (attnbench.bench.decode)
    decode_batch_length: int = 4096  # ... of its B=8 point
    decode_mqa_length: int = 65536  # ... of its MQA num_splits point
    varlen_lengths: tuple[int, ...] = (4096, 2048, 1024, 512, 256, 128, 64, 32)  # packed
    sinks_length: int = 4096  # L of sinks vs plain (forward and backward)
    precision_lengths: tuple[int, ...] = (2048, 4096)  # L of the precision section's prefill
    precision_torch_lengths: tuple[int, ...] = (1024,)  # more L for numba vs torch in bf16 only
    precision_backward_length: int = 2048  # L of its backward (float32 against bfloat16)
    sections: tuple[str, ...] = SECTIONS  # sections run (--only)
    interval_rounds: int = MIN_INTERVAL_SAMPLES  # fewest rounds of a section with interval targets
    quick: bool = False  # a quick run (smaller shapes): not the targets' shapes

    def speed_lengths(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.lengths)))


#: ``--quick``: the same checks on shapes that take ~1 minute on 2 cores.
QUICK = BenchConfig(lengths=(256, 512, 1024), peak_min_length=1024, float64_lengths=(512,),
                    rounds=3, memory_length=2048, padding_length=1024, parallel_length=1024,
                    startup_runs=1, backward_lengths=(256, 512), backward_memory_length=2048,
                    window_length=4096, documents_length=2048, score_length=1024,
                    window_backward_length=2048, decode_length=4096, decode_batch_length=1024,
                    decode_mqa_length=8192, varlen_lengths=(1024, 512, 256, 128, 64, 32, 16, 8),
                    sinks_length=1024, precision_lengths=(512,), precision_torch_lengths=(),
                    precision_backward_length=512,
                    quick=True)


def config_from_args(args) -> BenchConfig:
    """The :class:`BenchConfig` of ``attnbench bench``'s arguments."""
    config = QUICK if args.quick else BenchConfig()
    changes = {}
    if args.L:
        changes["lengths"] = tuple(args.L)
    if args.D:
        changes["head_size"] = args.D[0]
        changes["peak_head_sizes"] = tuple(dict.fromkeys(args.D))
    if args.causal != "both":
        changes["causal"] = (args.causal == "yes",)
    for name in ("rounds", "threads", "memory_length", "padding_length", "parallel_length",
                 "tiny_length", "startup_runs", "peak_min_length", "numpy_max_gb",
                 "backward_memory_length", "window_length", "documents_length",
                 "score_length", "window_backward_length", "decode_length",
                 "decode_batch_length", "decode_mqa_length"):
        value = getattr(args, name, None)
        if value is not None:
            changes[name] = value
    if args.float64_L is not None:
        changes["float64_lengths"] = tuple(args.float64_L)
    if args.peers is not None:
        changes["peers"] = tuple(args.peers)
    if getattr(args, "backward_L", None) is not None:
        changes["backward_lengths"] = tuple(args.backward_L)
    if getattr(args, "only", None):
        changes["sections"] = tuple(name for name in SECTIONS if name in args.only)
    return replace(config, **changes)


def command_line(config: BenchConfig) -> str:
    """The ``attnbench bench`` command that reruns ``config`` (every option spelled out)."""
    words = ["attnbench bench", "--L", *map(str, config.lengths),
             "--D", *map(str, dict.fromkeys((config.head_size, *config.peak_head_sizes))),
             "--causal", {(False, True): "both", (True,): "yes", (False,): "no"}.get(
                 tuple(config.causal), "both"),
             "--rounds", str(config.rounds), "--peak-min-L", str(config.peak_min_length),
             "--float64-L", *map(str, config.float64_lengths),
             "--memory-L", str(config.memory_length), "--tiny-L", str(config.tiny_length),
             "--padding-L", str(config.padding_length),
             "--parallel-L", str(config.parallel_length),
             "--startup-runs", str(config.startup_runs), "--peers", *config.peers,
             "--backward-L", *map(str, config.backward_lengths),
             "--backward-memory-L", str(config.backward_memory_length),
             "--window-L", str(config.window_length),
             "--documents-L", str(config.documents_length),
             "--score-L", str(config.score_length),
             "--window-backward-L", str(config.window_backward_length),
             "--decode-L", str(config.decode_length),
             "--decode-batch-L", str(config.decode_batch_length),
             "--decode-mqa-L", str(config.decode_mqa_length)]
    if tuple(config.sections) != SECTIONS:
        words += ["--only", *config.sections]
    if config.threads:
        words += ["--threads", str(config.threads)]
    if config.quick:
        words.append("--quick")
    return " ".join(words)
