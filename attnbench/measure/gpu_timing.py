"""Timing attention on a GPU: device-resident inputs, CUDA events, the card's peak.

A sweep point of a GPU backend (``cuda``: :mod:`kernels.cuda.launch`; ``torch-cuda``:
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

The card and its peak (the line a GPU row is compared with) are in
:mod:`attnbench.measure.gpu_device`.

Without a GPU, everything here runs in Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``)
when a sweep is told to allow it: then the times are host ``perf_counter`` times of the
simulation, meaningless as GPU times, and every row says so (``timing_method``).
``numba.cuda`` and torch are imported only when a GPU point runs.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from attnbench.measure.gpu_device import device_label, simulator
from attnbench.measure.peers import torch_sdpa_arguments
from attnbench.measure.timing import Timing, _batch_sizes, measure

__all__ = ["GpuTiming", "time_attention"]


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
        from attnbench import kernels

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
    """(upload, launch, download, device bytes) for the cuda backend."""
    from numba import cuda

    from attnbench.kernels.cuda import launch as cuda_backend

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

