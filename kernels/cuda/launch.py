"""The ``cuda`` backend: fused masked attention on an NVIDIA GPU with numba.cuda.

This module configures and launches the kernel; the pieces live beside it:

- :mod:`kernels.cuda.source`: the forward kernel (one thread per query row, K and V tiles
  in shared memory, online softmax; its docstring describes the design), its signatures
  and :func:`compile_ptx_all`;
- :mod:`kernels.cuda.device`: the device functions every CUDA kernel shares (dot product,
  one thread's online softmax over a tile, the dropout hash) and the simulator flag;
- :mod:`kernels.cuda.mods`: the kernel with the mod functions compiled in;
- :mod:`kernels.cuda.backward`: the backward kernels;
- :mod:`kernels.cuda.arrays`: the checks of device arrays given to
  :func:`attention_device`.

Entry points: :func:`run` (a validated problem of NumPy arrays, what
``kernels.attention(..., backend="cuda")`` calls), :func:`attention_device` (device arrays
in and out) and :func:`prepare_launch` (validate once, then launch only, for timing).
``kernels.cuda_backend`` is the public import path of the last two.
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np
from numba import cuda

from .._dropout import dropout_threshold
from .._dtypes import compute_dtype, rounded_to
from .._problems.dense import AttentionProblem
from ..mods.dense import run_user_code
from ..mods.lowering import user_names
from . import mods as cuda_mods
from .arrays import _as_device_array, _check_out, _device_problem
from .device import SIMULATOR
from .half import kernel_view, narrowed, storage_dtype, user_view
from .source import MAX_HEAD_DIM, _kernel

#: Dynamic shared memory a block may use without an opt-in, in bytes.
SHARED_MEMORY_BYTES = 48 * 1024
#: Query rows (threads) per block; the simulator runs one Python thread per CUDA thread.
BLOCK_Q = 4 if SIMULATOR else 64
#: Keys per shared-memory tile (lowered for large head sizes to fit SHARED_MEMORY_BYTES).
BLOCK_K = 4 if SIMULATOR else 64

# The simulator is not thread-safe: a launch configures the kernel object in place and swaps
# the kernel module's ``cuda`` global for a fake one while it runs.  Its calls are serialised.
_simulator_lock = threading.RLock() if SIMULATOR else contextlib.nullcontext()


def check_supported(problem: AttentionProblem) -> None:
    """Raise ValueError if the cuda backend cannot run ``problem`` (a head size > MAX_HEAD_DIM).

    float32, float64, float16 and bfloat16 inputs are all taken (half ones computed in
    float32: :mod:`kernels.cuda.half`)."""
    B, H, Hkv, Lq, Lk, D, Dv = problem.shape
    if D > MAX_HEAD_DIM or Dv > MAX_HEAD_DIM:
        raise ValueError(
            f"backend='cuda' supports head sizes up to {MAX_HEAD_DIM}; got D={D} and Dv={Dv} "
            f"(q {(B, H, Lq, D)}, k {(B, Hkv, Lk, D)}, v {(B, Hkv, Lk, Dv)}); "
            "use backend='numba' for larger heads"
        )


def _keys_per_tile(block_k: int, block_q: int, D: int, Dv: int, itemsize: int) -> int:
    """``block_k`` lowered until the K, V and score tiles fit in SHARED_MEMORY_BYTES
    (``itemsize``: of the compute dtype, in which the tiles are held)."""
    fits = SHARED_MEMORY_BYTES // (itemsize * (D + Dv + block_q))
    return max(1, min(block_k, fits))


def _launch(problem: AttentionProblem, q, k, v, out, weights, *, stream=0,
            block_q=None, block_k=None, lse=None) -> None:
    """Launch the kernel on device arrays; ``problem`` supplies everything but the data.

    ``problem.q``, ``.k`` and ``.v`` are only read for their shapes and dtype (they may be
    zero-memory stand-ins); ``q``, ``k``, ``v``, ``out`` (of the input dtype) and ``weights``
    (of the compute dtype: float32 for half inputs) are device arrays.
    """
    launch = _launcher(problem, q, k, v, out, weights, stream=stream, block_q=block_q,
                       block_k=block_k, lse=lse)
    launch()


def _launcher(problem: AttentionProblem, q, k, v, out, weights, *, stream=0,
              block_q=None, block_k=None, lse=None):
    """:func:`_launch` in two steps: copy the mask and key lengths now, launch when called.

    ``lse``: a (B, H, Lq) device array for the log-sum-exp, or None (one is allocated)."""
    B, H, _, Lq, _, D, Dv = problem.shape
    if B * H * Lq == 0:
        return lambda: None
    dtype = compute_dtype(problem.dtype)  # of the tiles, mask, scale, lse and weights
    block_q = min(block_q or BLOCK_Q, Lq)
    block_k = _keys_per_tile(block_k or BLOCK_K, block_q, D, Dv, dtype.itemsize)
    shared_bytes = block_k * (D + Dv + block_q) * dtype.itemsize
    n_blocks = B * H * ((Lq + block_q - 1) // block_q)

    has_mask = problem.mask is not None
    mask = (problem.additive_mask().reshape(-1).astype(dtype, copy=False) if has_mask
            else np.zeros(1, dtype=dtype))
    mask_dev = cuda.to_device(mask, stream=stream)  # (mask size,)
    lengths_dev = cuda.to_device(problem.key_lengths_or_full(), stream=stream)  # (B,)
    mask_sb, mask_sh, mask_si, mask_sj = problem.mask_strides()
    ftype = dtype.type
    kernel, mod_args = _kernel(problem.dtype), ((), ())
    if problem.score_mod is not None or problem.mask_mod is not None:
        kernel, mod_args = cuda_mods.kernel_and_arguments(problem, stream)  # mods compiled in
    if lse is None:
        lse = cuda.device_array((B, H, Lq), dtype=dtype, stream=stream)
    q, k, v, out = (kernel_view(x) for x in (q, k, v, out))  # bfloat16: its bits
    args = (
        q, k, v,
        mask_dev, mask_sb, mask_sh, mask_si, mask_sj, has_mask,
        lengths_dev, problem.causal_offset is not None, problem.causal_offset or 0,
        ftype(problem.scale), np.uint64(dropout_threshold(problem.dropout_p)),
        ftype(1.0 / (1.0 - problem.dropout_p)), np.uint64(problem.seed),
        out, weights, problem.return_weights,
        block_k, lse, *mod_args,
    )
    names = user_names(problem)
    # Configured at each launch: the simulator's kernel object keeps its configuration.
    return lambda: run_user_code(
        names, lambda: kernel[n_blocks, block_q, stream, shared_bytes](*args))


def run(problem: AttentionProblem, *, block_q: int | None = None, block_k: int | None = None,
        return_lse: bool = False):
    """Attention for a validated problem on the GPU; returns ``(out, weights or None)``.

    With ``return_lse``, ``(out, weights or None, lse)``, lse of shape (B, H, Lq).

    Copies the problem's NumPy arrays to the device, launches the kernel and copies the
    results back.  For half inputs ``out`` and ``weights`` have the input dtype (rounded to
    nearest even from float32) and ``lse`` is float32.

    Parameters
    ----------
    problem : AttentionProblem
    block_q, block_k : int, optional
        Query rows per block and keys per tile; default ``BLOCK_Q`` and ``BLOCK_K``.

    Returns
    -------
    out : ndarray, shape (B, H, Lq, Dv)
    weights : ndarray, shape (B, H, Lq, Lk), or None unless ``problem.return_weights``
    """
    check_supported(problem)
    B, H, _, Lq, Lk, _, Dv = problem.shape
    dtype, wide = problem.dtype, compute_dtype(problem.dtype)
    if B * H * Lq == 0:
        out = np.empty((B, H, Lq, Dv), dtype=dtype)
        weights = np.empty((B, H, Lq, Lk), dtype=dtype)
        result = out, (weights if problem.return_weights else None)
        return result + (np.empty((B, H, Lq), dtype=wide),) if return_lse else result

    with _simulator_lock:
        q = cuda.to_device(kernel_view(problem.q))  # (B, H, Lq, D)
        k = cuda.to_device(kernel_view(problem.k))  # (B, Hkv, Lk, D)
        v = cuda.to_device(kernel_view(problem.v))  # (B, Hkv, Lk, Dv)
        out = cuda.device_array((B, H, Lq, Dv), dtype=storage_dtype(dtype))
        weights_shape = (B, H, Lq, Lk) if problem.return_weights else (1, 1, 1, 1)
        weights = cuda.device_array(weights_shape, dtype=wide)  # raw scores, then weights
        lse = cuda.device_array((B, H, Lq), dtype=wide)
        _launch(problem, q, k, v, out, weights, block_q=block_q, block_k=block_k, lse=lse)
        result = (user_view(out.copy_to_host(), dtype),
                  rounded_to(weights.copy_to_host(), dtype) if problem.return_weights else None)
        return result + (lse.copy_to_host(),) if return_lse else result



def _validated(q, k, v, out, stream, **kwargs):
    """``(problem, q, k, v, out)`` for device inputs: every check, and ``out`` checked or
    allocated, shape (B, H, Lq, Dv).  ``kwargs`` are :func:`attention_device`'s."""
    q, k, v = (_as_device_array(name, x) for name, x in (("q", q), ("k", k), ("v", v)))
    problem = _device_problem(q, k, v, **kwargs)
    check_supported(problem)
    B, H, _, Lq, _, _, Dv = problem.shape
    return problem, q, k, v, _check_out(out, (B, H, Lq, Dv), problem.dtype, stream)


def attention_device(q, k, v, *, causal=False, mask=None, key_lengths=None, scale=None,
                     dropout_p=0.0, seed=None, return_weights=False, out=None, stream=0):
    """Masked multi-head attention on device arrays; nothing big is copied to or from the host.

    Same semantics as :func:`kernels.attention` with 4-D inputs.

    Parameters
    ----------
    q : device array, shape (B, H, Lq, D)
        Numba device array or any object with ``__cuda_array_interface__`` (CuPy, PyTorch),
        C-contiguous, float32, float64, float16 or bfloat16 (half ones computed in float32;
        ``out`` and the weights then have the input dtype).
    k : device array, shape (B, Hkv, Lk, D)
    v : device array, shape (B, Hkv, Lk, Dv)
    causal, mask, key_lengths, scale, dropout_p, seed, return_weights
        As in :func:`kernels.attention`; ``mask`` and ``key_lengths`` may be host arrays
        (device ones are copied to the host for validation).
    out : device array, shape (B, H, Lq, Dv), optional
        Where to write the output; allocated if not given.
    stream : numba stream or 0, default 0
        The stream for the copies of the mask and key lengths, the allocations and the launch.

    Returns
    -------
    out : device array, shape (B, H, Lq, Dv)
    weights : device array, shape (B, H, Lq, Lk)
        Only if ``return_weights``.

    Raises
    ------
    TypeError, ValueError
        Inputs not on the device, not 4-D C-contiguous, of the wrong dtype or of shapes that
        do not fit together (the message names the argument and the shapes); head sizes
        above MAX_HEAD_DIM.
    """
    with _simulator_lock:
        problem, q, k, v, out = _validated(
            q, k, v, out, stream, causal=causal, mask=mask, key_lengths=key_lengths,
            scale=scale, dropout_p=dropout_p, seed=seed, return_weights=return_weights,
        )
        B, H, _, Lq, Lk, _, _ = problem.shape
        weights_shape = (B, H, Lq, Lk) if return_weights else (1, 1, 1, 1)
        weights = cuda.device_array(weights_shape, dtype=compute_dtype(problem.dtype),
                                    stream=stream)
        _launch(problem, q, k, v, out, weights, stream=stream)
        if not return_weights:
            return out
        return out, narrowed(weights, problem.dtype, stream)


def prepare_launch(q, k, v, *, causal=False, mask=None, key_lengths=None, scale=None,
                   dropout_p=0.0, seed=None, out=None, stream=0):
    """Validate once and copy the mask and key lengths once; return ``(launch, out)``.

    ``launch()`` then only launches the kernel on the device arrays (asynchronously, on
    ``stream``): no validation, no allocation, no copy.  This is what a benchmark times
    with CUDA events (:mod:`attnbench.measure.gpu_timing`); :func:`attention_device` is the same
    computation as one call.  Arguments are those of :func:`attention_device` (no
    ``return_weights``).
    """
    with _simulator_lock:
        problem, q, k, v, out = _validated(
            q, k, v, out, stream, causal=causal, mask=mask, key_lengths=key_lengths,
            scale=scale, dropout_p=dropout_p, seed=seed, return_weights=False,
        )
        weights = cuda.device_array((1, 1, 1, 1), dtype=compute_dtype(problem.dtype),
                                    stream=stream)
        launch = _launcher(problem, q, k, v, out, weights, stream=stream)

    def locked_launch():
        with _simulator_lock:
            launch()

    return (locked_launch if SIMULATOR else launch), out
