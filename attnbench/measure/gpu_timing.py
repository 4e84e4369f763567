"""Timing attention on a GPU: device-resident inputs, CUDA events, the card's peak.

A sweep point of a GPU backend (``cuda``: :mod:`kernels.cuda_backend`; ``torch-cuda``:
PyTorch's ``scaled_dot_product_attention`` on the GPU) is measured in three parts, each
with :class:`attnbench.measure.timing.Timing` statistics (median, IQR over batches):

- **host -> device**: copying q, k and v (NumPy, pageable memory) into device arrays
  allocated beforehand;
- **kernel**: the attention alone, on arrays already on the device, timed with CUDA
  events recorded on the stream around a batch of launches.  Before each batch a
  *blocker* kernel (one thread sleeping with ``nanosleep``, about twice as long as the
  host took to enqueue the previous batch) keeps the GPU busy while the host enqueues
  the launches, so the events see back-to-back kernels and not the host's launch
  overhead; the host's enqueue time per launch is reported beside it
  (``launch_overhead_us``), and ``launch_bound`` flags a point whose enqueueing took longer
  than the blocker may have lasted;
- **device -> host**: copying the output back.

``host_call_ms`` is the whole NumPy-in, NumPy-out call (``kernels.attention(...,
backend="cuda")``: checks, copies, launch, copy back) timed with ``perf_counter``, as a
NumPy user sees it.

The reference line is the card's peak for the dtype (:func:`device_peak_gflops`):

- float32: the theoretical peak from the device attributes, ``SMs x FP32 lanes per SM x
  boost clock x 2`` (an FMA is 2 FLOPs).  The lanes per SM come from the throughput
  table of the CUDA C++ Programming Guide (:data:`FP32_LANES_PER_SM`, by compute
  capability; 128 on sm_90, so an H100/H200 SXM with 132 SMs at 1.98 GHz gives
  66.9 TFLOP/s).  Assumption: the SMs run at the attribute's clock (the maximum boost
  clock); a card throttled by power or heat runs slower, so this is an upper bound.
- float64, or a compute capability missing from the table: measured, with a simple
  FMA kernel (:func:`fma_peak_gflops`: many threads, 8 independent FMA chains each, no
  cuBLAS).  ``attnbench.gpu_check`` reports the float32 FMA measurement beside the
  theoretical number as a cross-check of both.

Without a GPU, everything here runs in Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``)
when a sweep is told to allow it: then the times are host ``perf_counter`` times of the
simulation, meaningless as GPU times, and every row says so (``timing_method``).
``numba.cuda`` and torch are imported only when a GPU point runs.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from attnbench.measure.peers import torch_sdpa_arguments
from attnbench.measure.timing import Timing, _batch_sizes, measure

__all__ = ["FP32_LANES_PER_SM", "GpuTiming", "Peak", "backend_status", "device_label",
           "device_peak_gflops", "device_record", "fma_peak_gflops", "theoretical_fp32_gflops",
           "time_attention"]

#: FP32 results per clock per SM (add, multiply, fused multiply-add), by compute capability,
#: from the "Arithmetic Instructions" throughput table of the CUDA C++ Programming Guide.
FP32_LANES_PER_SM = {
    (5, 0): 128, (5, 2): 128, (5, 3): 128, (6, 0): 64, (6, 1): 128, (6, 2): 128,
    (7, 0): 64, (7, 2): 64, (7, 5): 64, (8, 0): 64, (8, 6): 128, (8, 7): 128, (8, 9): 128,
    (9, 0): 128, (10, 0): 128, (10, 3): 128, (12, 0): 128, (12, 1): 128,
}
#: Independent FMA chains per thread of the FMA kernel (attnbench.measure._cuda_kernels).
FMA_CHAINS = 8


def simulator() -> bool:
    """True if numba.cuda is Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM`` set)."""
    from kernels import cuda_simulator_enabled

    return cuda_simulator_enabled()


def backend_status(backend: str, *, allow_simulator: bool = False) -> tuple[bool, str]:
    """``(usable, why)`` for a GPU backend of a sweep ("cuda" or "torch-cuda")."""
    if backend == "cuda":
        from kernels import cuda_status, has_real_gpu

        usable, why = cuda_status()
        if not usable:
            return False, f"cuda: {why}"
        if not has_real_gpu() and not allow_simulator:
            return False, ("cuda runs only on a real GPU in a sweep (Numba's CUDA simulator is "
                           f"far too slow; allow it for tiny grids); here: {why}")
        return True, why
    if backend == "torch-cuda":
        import importlib.util

        if importlib.util.find_spec("torch") is None:
            return False, "torch-cuda: torch is not installed"
        try:
            import torch
        except Exception as exc:
            return False, f"torch-cuda: torch cannot be imported ({type(exc).__name__}: {exc})"
        if not torch.cuda.is_available():
            build = torch.version.cuda or "a CPU-only build"
            return False, f"torch-cuda: torch {torch.__version__} ({build}) sees no CUDA GPU"
        return True, f"torch {torch.__version__} on {torch.cuda.get_device_name()}"
    raise ValueError(f"backend {backend!r} is not a GPU backend; expected cuda or torch-cuda")


# --- the device and its peak -------------------------------------------------------------------


def theoretical_fp32_gflops(sm_count: int, compute_capability: tuple[int, int],
                            clock_khz: float) -> float:
    """``SMs x FP32 lanes per SM x clock x 2`` in GFLOP/s; nan for an unknown architecture."""
    lanes = FP32_LANES_PER_SM.get(tuple(compute_capability))
    if lanes is None or not sm_count or not clock_khz:
        return float("nan")
    return sm_count * lanes * clock_khz * 1e3 * 2 / 1e9


@functools.cache
def _device_record() -> dict:
    if simulator():
        return {"name": "Numba CUDA simulator", "simulator": True,
                "note": "no GPU: kernels run as Python threads; times are not GPU times"}
    from numba import cuda

    device = cuda.get_current_device()
    cc = tuple(device.compute_capability)
    record = {"name": device.name.decode() if isinstance(device.name, bytes) else device.name,
              "simulator": False, "id": device.id, "uuid": device.uuid,
              "compute_capability": f"{cc[0]}.{cc[1]}"}
    for attribute in ("MULTIPROCESSOR_COUNT", "CLOCK_RATE", "MEMORY_CLOCK_RATE",
                      "GLOBAL_MEMORY_BUS_WIDTH", "MAX_SHARED_MEMORY_PER_BLOCK"):
        try:
            record[attribute.lower()] = int(getattr(device, attribute))
        except Exception as exc:  # an attribute a driver does not know: recorded as missing
            record[attribute.lower()] = None
            record.setdefault("missing_attributes", []).append(f"{attribute}: {exc}")
    try:
        record["memory_bytes"] = int(cuda.current_context().get_memory_info().total)
    except Exception:
        record["memory_bytes"] = None
    try:
        from numba.cuda.cudadrv import driver, runtime

        record["driver_version"] = ".".join(map(str, driver.get_version()))
        record["runtime_version"] = ".".join(map(str, runtime.get_version()))
    except Exception:
        pass
    lanes = FP32_LANES_PER_SM.get(cc)
    record["fp32_lanes_per_sm"] = lanes
    record["fp32_peak_theoretical_gflops"] = theoretical_fp32_gflops(
        record["multiprocessor_count"], cc, record["clock_rate"] or 0)
    return record


def device_record() -> dict:
    """The current GPU: name, compute capability, SMs, clocks, memory, versions, fp32 peak."""
    return dict(_device_record())


def device_label() -> str:
    """``"NVIDIA H200 (cc 9.0)"``, or ``"CUDA simulator"``: the report groups rows by it."""
    record = _device_record()
    if record["simulator"]:
        return "CUDA simulator"
    return f"{record['name']} (cc {record['compute_capability']})"


@dataclass(frozen=True)
class Peak:
    """The reference line of a dtype on this device."""

    gflops: float
    source: str  # how it was obtained, for the row and the report


@functools.cache
def device_peak_gflops(dtype: str) -> Peak:
    """The card's peak for ``dtype`` (see the module docstring); cached per process."""
    if simulator():
        return Peak(float("nan"), "none: CUDA simulator")
    record = _device_record()
    if np.dtype(dtype) == np.float32:
        theoretical = record["fp32_peak_theoretical_gflops"]
        if math.isfinite(theoretical):
            return Peak(theoretical, (
                f"theoretical fp32: {record['multiprocessor_count']} SMs x "
                f"{record['fp32_lanes_per_sm']} lanes x {record['clock_rate'] / 1e6:.3g} GHz "
                "x 2"))
    measured = fma_peak_gflops(dtype)
    return Peak(measured, f"measured: FMA kernel, {np.dtype(dtype).name}")


@functools.cache
def fma_peak_gflops(dtype, *, iterations: int = 4096, repeat: int = 5) -> float:
    """Measured FMA throughput of the device in ``dtype``, GFLOP/s (nan in the simulator).

    Launches ``32 x SMs`` blocks of 256 threads, each running FMA_CHAINS independent
    chains of ``iterations`` FMAs (2 FLOPs each), timed with CUDA events; the best of
    ``repeat`` launches after one warm-up (compilation).
    """
    if simulator():
        return float("nan")
    from numba import cuda

    from attnbench.measure._cuda_kernels import fma_kernel

    dtype = np.dtype(dtype)
    sms = _device_record()["multiprocessor_count"] or 1
    blocks, threads = 32 * sms, 256
    out = cuda.device_array(blocks * threads, dtype=dtype)
    kernel = fma_kernel(dtype)
    args = (out, np.int64(iterations), dtype.type(0.999), dtype.type(0.001))
    kernel[blocks, threads](*args)  # compiles
    cuda.synchronize()
    best = math.inf
    for _ in range(repeat):
        start, end = cuda.event(), cuda.event()
        start.record()
        kernel[blocks, threads](*args)
        end.record()
        end.synchronize()
        best = min(best, cuda.event_elapsed_time(start, end) / 1e3)
    flops = 2.0 * FMA_CHAINS * iterations * blocks * threads
    return flops / best / 1e9


# --- timing a point ----------------------------------------------------------------------------


@dataclass
class GpuTiming:
    """A GPU point's measurements; times in seconds per call."""

    kernel: Timing  # the attention alone, device arrays, CUDA events
    h2d: Timing  # q, k, v to the device
    d2h: Timing  # the output back
    host_call: Timing | None  # the NumPy-in NumPy-out call, perf_counter (None: not timed)
    out: np.ndarray  # (B, H, L, Dv) on the host: the output that is checked
    transfer_in_bytes: int
    transfer_out_bytes: int
    device_bytes: int  # device memory of inputs, output and mask
    timing_method: str
    device: str
    launch_overhead_us: float = float("nan")  # host time to enqueue one launch
    launch_bound: bool = False  # the host may have been slower than the GPU (see above)

    def columns(self) -> dict:
        """The columns a sweep row gets besides the kernel timing."""
        def rate(n_bytes, seconds):
            return n_bytes / seconds / 1e9 if seconds > 0 else float("nan")

        return {
            "device": self.device, "timing_method": self.timing_method,
            "h2d_ms": self.h2d.median * 1e3, "d2h_ms": self.d2h.median * 1e3,
            "h2d_gbps": rate(self.transfer_in_bytes, self.h2d.median),
            "d2h_gbps": rate(self.transfer_out_bytes, self.d2h.median),
            "host_call_ms": (self.host_call.median * 1e3 if self.host_call is not None
                             else float("nan")),
            "launch_overhead_us": self.launch_overhead_us, "launch_bound": self.launch_bound,
        }


class _EventTimer:
    """Times batches of asynchronous GPU work with events, behind a blocker kernel.

    ``events()`` makes a (start, end) pair; ``elapsed(start, end)`` returns seconds.  The
    numba flavour serves both backends: torch's default stream is CUDA's legacy default
    stream, as numba's stream 0, so a numba blocker on stream 0 also holds torch's work.
    """

    def __init__(self):
        from numba import cuda

        from attnbench.measure._cuda_kernels import blocker

        self.cuda = cuda
        self.enqueue_seconds = 0.0  # host time to enqueue the last batch
        self.launch_bound = False
        self._blocker = blocker()
        self._blocker[1, 1](np.uint32(1))  # compile now, not inside a measurement
        cuda.synchronize()

    def batch(self, fn: Callable[[], object], number: int, *, blocker: bool = True) -> float:
        """GPU seconds of ``number`` back-to-back calls of ``fn``.

        With ``blocker``, ``fn`` must only enqueue work (a kernel launch); without, it may
        block the host (a copy from pageable memory), and the events time the copies.
        """
        cuda = self.cuda
        start, end = cuda.event(), cuda.event()
        if blocker:
            block_us = int(min(2e5, 50 + 2e6 * self.enqueue_seconds))
            self._blocker[1, 1](np.uint32(block_us))
        began = time.perf_counter()
        start.record()
        for _ in range(number):
            fn()
        end.record()
        if blocker:
            self.enqueue_seconds = time.perf_counter() - began
            if self.enqueue_seconds * 1e6 > block_us:
                self.launch_bound = True  # the blocker may have ended before the last launch
        end.synchronize()
        return cuda.event_elapsed_time(start, end) / 1e3


@functools.cache
def _event_timer() -> _EventTimer:
    """One timer per process (its blocker kernel is compiled once)."""
    return _EventTimer()


def _measure_gpu(fn, timer: _EventTimer | None, *, max_time: float, repeat: int = 7,
                 min_time: float = 2e-4, blocker: bool = True) -> Timing:
    """:func:`attnbench.measure.timing.measure` semantics, with event-timed batches on a GPU.

    One untimed call first; then batches of 1, 2, 5, 10, ... calls until one lasts
    ``min_time`` of GPU time (that batch is the first sample); then batches of that size
    until ``repeat`` samples or ``max_time`` GPU seconds (at least 3 samples).
    """
    if timer is None:  # the simulator: host time of the simulation
        return measure(fn, warmup=1, repeat=3, min_repeat=1, min_time=0, max_time=max_time,
                       number=1)
    fn()
    timer.cuda.synchronize()
    spent, samples = 0.0, []
    for number in _batch_sizes():
        elapsed = timer.batch(fn, number, blocker=blocker)
        spent += elapsed
        if elapsed >= min_time or number >= 10_000:
            break
    samples.append(elapsed / number)
    while len(samples) < repeat and (len(samples) < 3 or spent + elapsed <= max_time):
        elapsed = timer.batch(fn, number, blocker=blocker)
        spent += elapsed
        samples.append(elapsed / number)
    return Timing(samples=tuple(samples), number=number, warmup=1)


def time_attention(backend: str, q, k, v, kwargs: dict, *, max_time: float = 0.2,
                   host_call: bool = True) -> GpuTiming:
    """Measure one GPU attention: transfers, kernel (events), the whole NumPy call.

    Parameters
    ----------
    backend : {"cuda", "torch-cuda"}
    q, k, v : ndarray, (B, H, L, D), (B, Hkv, L, D), (B, Hkv, L, Dv)
    kwargs : dict
        ``causal``, ``mask`` (bool), ``key_lengths``, as a sweep point passes them.
    max_time : float
        Budget (s) of the kernel timing; transfers get a quarter each.
    host_call : bool
        Also time the NumPy-in, NumPy-out call (cuda only).
    """
    timer = None if simulator() else _event_timer()
    if timer is not None:
        timer.launch_bound = False
    if backend == "cuda":
        parts = _cuda_parts(q, k, v, kwargs)
    elif backend == "torch-cuda":
        parts = _torch_parts(q, k, v, kwargs)
    else:
        raise ValueError(f"backend {backend!r} is not a GPU backend")
    upload, launch, download, device_bytes = parts
    h2d = _measure_gpu(upload, timer, max_time=max_time / 4, repeat=5, blocker=False)
    kernel = _measure_gpu(launch, timer, max_time=max_time)
    enqueue = timer.enqueue_seconds if timer is not None else float("nan")
    launch_bound = bool(timer is not None and timer.launch_bound)
    d2h = _measure_gpu(download, timer, max_time=max_time / 4, repeat=5, blocker=False)
    out = download(synchronous=True)
    whole = None
    if host_call and backend == "cuda":
        import kernels

        whole = measure(lambda: kernels.attention(q, k, v, backend="cuda", **kwargs),
                        warmup=1, repeat=5, min_repeat=1 if timer is None else 3,
                        max_time=max_time / 2)
    return GpuTiming(
        kernel=kernel, h2d=h2d, d2h=d2h, host_call=whole, out=out,
        transfer_in_bytes=q.nbytes + k.nbytes + v.nbytes, transfer_out_bytes=out.nbytes,
        device_bytes=device_bytes,
        timing_method=("CUDA events (kernel and copies), blocker kernel ahead of each batch"
                       if timer is not None else
                       "perf_counter of Numba's CUDA simulator: NOT GPU time"),
        device=device_label() if backend == "cuda" or timer is None else _torch_device(),
        launch_overhead_us=enqueue / max(kernel.number, 1) * 1e6,
        launch_bound=launch_bound,
    )


def _cuda_parts(q, k, v, kwargs):
    """(upload, launch, download, device bytes) for kernels.cuda_backend."""
    from numba import cuda

    from kernels import cuda_backend

    q_dev, k_dev, v_dev = (cuda.to_device(x) for x in (q, k, v))

    def upload():  # into the arrays already allocated: the copies alone
        for host, device in ((q, q_dev), (k, k_dev), (v, v_dev)):
            device.copy_to_device(host)

    launch, out_dev = cuda_backend.prepare_launch(q_dev, k_dev, v_dev, **kwargs)
    host_out = np.empty(out_dev.shape, dtype=out_dev.dtype)

    def download(synchronous=False):
        if synchronous:
            launch()
            return out_dev.copy_to_host()
        out_dev.copy_to_host(host_out)
        return host_out

    mask = kwargs.get("mask")
    device_bytes = sum(x.nbytes for x in (q_dev, k_dev, v_dev, out_dev)) + (
        mask.nbytes if mask is not None else 0)
    return upload, launch, download, device_bytes


def _torch_device() -> str:
    import torch

    major, minor = torch.cuda.get_device_capability()
    return f"{torch.cuda.get_device_name()} (cc {major}.{minor})"


def _torch_parts(q, k, v, kwargs):
    """(upload, launch, download, device bytes) for PyTorch's SDPA on the GPU."""
    import torch  # optional peer
    from torch.nn.functional import scaled_dot_product_attention

    qt, kt, vt, sdpa_kwargs = torch_sdpa_arguments(q, k, v, kwargs, device="cuda")
    hosts = [torch.from_numpy(np.ascontiguousarray(x)) for x in (q, k, v)]

    def upload():  # into the tensors already allocated: the copies alone
        for host, on_device in zip(hosts, (qt, kt, vt), strict=True):
            on_device.copy_(host)
    result = {}

    def launch():
        with torch.no_grad():
            result["out"] = scaled_dot_product_attention(qt, kt, vt, **sdpa_kwargs)

    launch()
    torch.cuda.synchronize()

    def download(synchronous=False):
        if synchronous:
            launch()
        return result["out"].cpu().numpy()

    device_bytes = sum(x.numel() * x.element_size() for x in (qt, kt, vt, result["out"]))
    if sdpa_kwargs["attn_mask"] is not None:
        device_bytes += sdpa_kwargs["attn_mask"].numel() * sdpa_kwargs["attn_mask"].element_size()
    return upload, launch, download, device_bytes
