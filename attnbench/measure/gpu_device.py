"""The GPU: which GPU backends can run, the device record and its peak.

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

``numba.cuda`` and torch are imported only when asked about (optional dependencies).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

__all__ = ["FMA_CHAINS", "FP32_LANES_PER_SM", "Peak", "backend_status", "device_label",
           "device_peak_gflops", "device_record", "fma_peak_gflops", "simulator",
           "theoretical_fp32_gflops"]

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
    from attnbench.kernels import cuda_simulator_enabled

    return cuda_simulator_enabled()


def backend_status(backend: str, *, allow_simulator: bool = False) -> tuple[bool, str]:
    """``(usable, why)`` for a GPU backend of a sweep ("cuda" or "torch-cuda")."""
    if backend == "cuda":
        from attnbench.kernels import cuda_status, has_real_gpu

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
