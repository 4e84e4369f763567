"""The machine record every result carries, and the machine's measured GEMM peak.

A timing means little without the machine it came from: the CPU, how many threads
Numba and the BLAS used, which threading layer, and the library versions.
:func:`machine_record` gathers these once per process (JSON-serialisable);
:func:`machine_columns` flattens the essentials into columns for a result table.
:func:`gemm_peak_gflops` measures what the CPU reaches on a dense float GEMM with
NumPy's BLAS, the yardstick GFLOP/s of the attention kernels are read against.  Every such
measurement is a *probe*: the peak it returns is the maximum over all the probes this
process took of the same product (interference only slows a product down, so one
disturbed probe cannot lower the peak), and :func:`gemm_peak_record` (in the machine
record) says how many probes there were and what each read.
"""

from __future__ import annotations

import copy
import functools
import importlib.metadata
import os
import platform
import sys
from pathlib import Path

import numba
import numpy as np
from numba import njit, prange
from threadpoolctl import threadpool_info

from attnbench import kernels
from attnbench.measure import allocation
from attnbench.measure.bandwidth import bandwidth_record
from attnbench.measure.timing import measure

__all__ = ["BUSY_LOAD_PER_CORE", "busy_machine", "gemm_peak_gflops", "gemm_peak_record",
           "machine_columns", "machine_record", "plan_ahead"]

#: Environment variables that change how the BLAS or Numba run; recorded when set.
RECORDED_ENV_VARS = (
    "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
    "MKL_NUM_THREADS", "NUMBA_NUM_THREADS", "NUMBA_THREADING_LAYER", "NUMBA_ENABLE_CUDASIM",
    "GLIBC_TUNABLES",
)


#: A machine is busy when its 1-min load average exceeds this many runnable processes per
#: usable core: more wanted a core than there were cores, so some waited.  A run's own
#: threads count in a reading taken during or just after it (up to one per core), so a
#: lower bar would call every run on all cores busy: a load of 1.2 on 2 cores is the run
#: itself and a little more.
BUSY_LOAD_PER_CORE = 1.0


def busy_machine(load: float, cores: int | None) -> bool:
    """True if a 1-min ``load`` average means processes waited for one of ``cores`` cores."""
    return bool(cores) and load > cores * BUSY_LOAD_PER_CORE


def _cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else :func:`platform.processor`."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Processor", "cpu model"):
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _usable_cores() -> int | None:
    """Cores this process may run on (affinity, cgroup cpusets), if the OS says."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


@functools.cache
def _probe_parallel():
    """A trivial ``parallel=True`` kernel: running it once makes Numba pick a threading layer."""
    @njit(parallel=True)
    def _sum(n):
        total = 0
        for i in prange(n):
            total += i
        return total

    return _sum


def numba_threading_layer() -> str:
    """The threading layer Numba uses (``"omp"``, ``"tbb"`` or ``"workqueue"``).

    Numba chooses it on the first parallel launch, so if none has run yet a trivial
    parallel kernel is run once (it compiles in well under a second).
    """
    try:
        return numba.threading_layer()
    except ValueError:  # no parallel kernel has run yet
        pass
    try:
        _probe_parallel()(4)
        return numba.threading_layer()
    except Exception as exc:  # a broken layer must not stop the record
        return f"unknown ({type(exc).__name__}: {exc})"


def _owner(filepath: str | None) -> str | None:
    """The package that ships a library: ``.../site-packages/numpy.libs/x.so`` -> ``numpy``."""
    if not filepath:
        return None
    parts = Path(filepath).parts
    for site in ("site-packages", "dist-packages"):
        if site in parts and parts.index(site) + 1 < len(parts) - 1:
            return parts[parts.index(site) + 1].removesuffix(".libs")
    return None


def _threadpools() -> tuple[list[dict], list[dict]]:
    """BLAS and OpenMP libraries loaded in this process, as threadpoolctl sees them.

    Often two BLAS are loaded: NumPy's, and SciPy's, which Numba loads for ``np.dot``
    and ``np.linalg`` inside compiled code; ``owner`` tells them apart.
    """
    keys = ("internal_api", "version", "architecture", "threading_layer", "num_threads",
            "prefix", "filepath")
    blas, openmp = [], []
    for pool in threadpool_info():
        entry = {key: pool.get(key) for key in keys}
        entry["owner"] = _owner(entry["filepath"])
        (blas if pool.get("user_api") == "blas" else openmp).append(entry)
    return blas, openmp


def _version(package: str) -> str | None:
    """Version of ``package``: of the loaded module if imported, else installed metadata."""
    module = sys.modules.get(package)
    if module is not None and hasattr(module, "__version__"):
        return str(module.__version__)
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def _record() -> dict:
    layer = numba_threading_layer()  # may load an OpenMP runtime: before threadpoolctl
    blas, openmp = _threadpools()
    return {
        "cpu_model": _cpu_model(),
        "logical_cores": os.cpu_count(),
        "usable_cores": _usable_cores(),
        "numba_threads": numba.get_num_threads(),
        "numba_threading_layer": layer,
        "blas": blas,
        "openmp": openmp,
        "env": {name: os.environ[name] for name in RECORDED_ENV_VARS if name in os.environ},
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numba": numba.__version__,
        "pandas": _version("pandas"),
        "threadpoolctl": _version("threadpoolctl"),
        "torch": _version("torch"),
        "numba_cuda": _version("numba-cuda"),
        "hostname": platform.node(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "steady_allocation": allocation.available(),
    }


def machine_record() -> dict:
    """Where and with what a measurement ran: CPU, threads, BLAS, versions.

    Gathered once per process (later calls return a copy of the first record), and
    JSON-serialisable.

    Returns
    -------
    dict
        ``cpu_model``, ``logical_cores`` (:func:`os.cpu_count`), ``usable_cores``
        (affinity), ``numba_threads``, ``numba_threading_layer``, ``blas`` and ``openmp``
        (lists of threadpoolctl entries: ``internal_api``, ``version``, ``architecture``,
        ``threading_layer``, ``num_threads``, ``prefix``, ``filepath``, and ``owner``, the
        package that ships the library, e.g. ``numpy`` or ``scipy``), ``env`` (the
        :data:`RECORDED_ENV_VARS` that are set, e.g. ``OPENBLAS_CORETYPE``), the versions
        ``python``, ``numpy``, ``numba``, ``pandas``, ``threadpoolctl``, ``torch`` and
        ``numba_cuda`` (``None`` when not installed), ``hostname``, ``platform`` and
        ``machine``, and ``gemm_peak_probes`` (:func:`gemm_peak_record`: the GEMM peak
        probes taken so far in this process), ``read_bandwidth_probes``
        (:func:`attnbench.measure.bandwidth.bandwidth_record`: the read-bandwidth probes,
        decoding's yardstick), and ``attention_plan``
        (:func:`kernels.attention_plan`: per dtype, the numba backend's tile-product path
        on this machine, ``"8x16"`` (the micro-kernel's register block), ``"blas"`` or
        ``"not planned"``; read when the record is made, never planned for it), and
        ``compiled_forms`` (:func:`kernels.compiled_forms`: the CPU target Numba compiles
        for, the register blocks planned among, and whether the bfloat16 products use
        ``vdpbf16ps`` or its emulation).

    Notes
    -----
    ``numba_threads`` is read when the record is first made; a later
    ``numba.set_num_threads`` is not reflected.  The ``torch`` version is read from the
    installed metadata unless torch is already imported (importing it takes seconds).
    """
    return {**copy.deepcopy(_record()), "gemm_peak_probes": gemm_peak_record(),
            "read_bandwidth_probes": bandwidth_record(),
            "attention_plan": kernels.attention_plan(),
            "compiled_forms": kernels.compiled_forms()}


def _blas_summary(blas: list[dict]) -> str:
    """``"numpy: openblas 0.3.31 SkylakeX x2"`` for each loaded BLAS, joined by ``"; "``."""
    parts = []
    for entry in blas:
        words = [f"{entry['owner']}:" if entry.get("owner") else None, entry["internal_api"],
                 entry["version"], entry.get("architecture"), f"x{entry['num_threads']}"]
        parts.append(" ".join(str(word) for word in words if word))
    return "; ".join(parts) or "none loaded"


def machine_columns(record: dict | None = None) -> dict:
    """The record's essentials as flat columns (str/int) for every row of a result table.

    Parameters
    ----------
    record : dict, optional
        A :func:`machine_record`; made if not given.
    """
    record = machine_record() if record is None else record
    return {
        "cpu_model": record["cpu_model"],
        "logical_cores": record["logical_cores"],
        "numba_threads": record["numba_threads"],
        "threading_layer": record["numba_threading_layer"],
        "blas": _blas_summary(record["blas"]),
        "python": record["python"],
        "numpy": record["numpy"],
        "numba": record["numba"],
        "hostname": record["hostname"],
        "steady_allocation": record.get("steady_allocation", False),
    }


def _forms_line(forms: dict | None) -> list[str]:
    """The ``Target`` line: what Numba compiles for (none for a record made without it)."""
    if not forms:
        return []
    return [f"Target     Numba compiles for {forms['target']}; bfloat16 products "
            f"{forms['bfloat16_products']}"]


def summary_lines(record: dict | None = None) -> list[str]:
    """A few human-readable lines describing the machine, for the console."""
    record = machine_record() if record is None else record
    env = ", ".join(f"{key}={value}" for key, value in record["env"].items()) or "none"
    return [
        f"CPU        {record['cpu_model']} ({record['logical_cores']} logical cores, "
        f"{record['usable_cores']} usable)",
        f"Numba      {record['numba']}: {record['numba_threads']} threads, "
        f"{record['numba_threading_layer']} layer",
        f"BLAS       {_blas_summary(record['blas'])}",
        "Tiles      numba backend's tile products: " + ", ".join(
            f"{dtype} {path}" for dtype, path in record.get("attention_plan", {}).items()),
        *_forms_line(record.get("compiled_forms")),
        f"Versions   python {record['python']}, numpy {record['numpy']}, "
        f"pandas {record['pandas']}, torch {record['torch']}",
        f"Host       {record['hostname']} ({record['platform']})",
        f"Env        {env}",
    ]


#: GFLOP/s read by every GEMM peak probe of this process, by :func:`_peak_key`.
_PEAK_READINGS: dict[str, list[float]] = {}


def _peak_key(dtype, n: int) -> str:
    """``"float32 n=1024 blas_threads=2"``: what a probe measured (threads change the peak)."""
    threads = max((pool.get("num_threads") or 0 for pool in threadpool_info()
                   if pool.get("user_api") == "blas"), default=0)
    return f"{np.dtype(dtype).name} n={n} blas_threads={threads}"


def gemm_peak_gflops(dtype=np.float32, n: int = 1024, *, repeat: int = 7,
                     max_time: float = 2.0) -> float:
    """The machine's dense GEMM throughput with NumPy's BLAS, in GFLOP/s: the best probe.

    Each call is a probe: it times ``a @ b`` for square ``n x n`` matrices (``2·n³``
    FLOPs) with :func:`attnbench.measure.timing.measure` and reads the FLOPs over the
    *fastest* product.  It returns the maximum over every probe this process took of the
    same dtype, ``n`` and BLAS thread count, this one included: interference only ever
    slows a product down, so a probe taken while another process held a core cannot lower
    the peak and push a "% of peak" above 100.  Callers probe again through a long run
    (:func:`attnbench.sweep.run.run_sweep` does) so that the peak does not rest on one
    moment; :func:`gemm_peak_record` lists the probes.

    Parameters
    ----------
    dtype : dtype, default float32
    n : int, default 1024
        Matrix size; large enough for the BLAS to reach its plateau on a few cores
        (2.1 GFLOP per product), small enough to take milliseconds.
    repeat : int, default 7
        Timed products (the fastest is used); one untimed warm-up comes first.
    max_time : float, default 2.0
        Time budget in seconds (see :func:`attnbench.measure.timing.measure`).

    Returns
    -------
    float
    """
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(dtype)
    b = rng.standard_normal((n, n)).astype(dtype)
    out = np.empty((n, n), dtype=dtype)
    timing = measure(lambda: np.matmul(a, b, out=out), repeat=repeat, max_time=max_time,
                     number=1)
    readings = _PEAK_READINGS.setdefault(_peak_key(dtype, n), [])
    readings.append(2 * n**3 / timing.min / 1e9)
    return max(readings)


def gemm_peak_record() -> dict:
    """The GEMM peak probes of this process: ``{key: {"gflops", "probes", "readings"}}``.

    ``key`` as ``"float32 n=1024 blas_threads=2"``; ``gflops`` is the peak (the maximum),
    ``probes`` how many probes were taken, ``readings`` what each read (GFLOP/s, in order).
    """
    return {key: {"gflops": max(values), "probes": len(values),
                  "readings": [round(value, 3) for value in values]}
            for key, values in _PEAK_READINGS.items()}


def plan_ahead(problems, *, out=sys.stderr) -> dict:
    """Plan the numba backend's tile path before timing, where a timed call would plan.

    A numba call of at least the planning limit's work plans at first use on a machine
    with no stored choice (:func:`kernels.plan_needed`): 20-45 s inside a timed call, and
    a switch of tile path in the middle of a sweep.  This plans those dtypes first, says
    so on ``out``, and leaves smaller problems alone (they use the stored choice, or the
    BLAS tiles until something plans).

    Parameters
    ----------
    problems : iterable of (backend, shape, dtype)
        ``shape`` as :func:`kernels.plan_needed` takes it, ``(B, H, Lq, Lk, D, Dv)``.
    out : file, default sys.stderr
        Where the notice goes (None: silent).

    Returns
    -------
    dict
        :func:`kernels.attention_plan` afterwards.
    """
    dtypes = sorted({str(dtype) for backend, shape, dtype in problems
                     if backend == "numba" and kernels.plan_needed(shape, dtype)})
    if dtypes:
        if out is not None:
            print(f"Planning the numba backend's tile products for {', '.join(dtypes)} on "
                  "this machine (once: the choice is stored beside Numba's cache; "
                  "~20-45 s) ...", file=out, flush=True)
        kernels.plan(dtypes)
    return kernels.attention_plan()
