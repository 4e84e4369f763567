"""The ``cuda`` backend: fused masked attention on an NVIDIA GPU with numba.cuda.

One CUDA thread owns one query row; a block holds ``BLOCK_Q`` consecutive rows
of one (batch, head) and the 1-D grid covers every (batch, head, query tile),
query tiles of the same head side by side so that they share K and V in L2.
The block walks the keys in tiles of ``BLOCK_K``: its threads copy the K and V
rows of a tile into shared memory together, then each thread scores its row
against the tile and updates its online softmax (running max ``m``, running sum
``ℓ``, rescale by ``exp(m_old - m_new)``), with the unnormalised output row in
a per-thread ``cuda.local.array``.  The semantics are those of the CPU kernel
in :mod:`kernels.numba_cpu`, line for line:

- a key hidden by ``causal``, ``key_lengths`` or the mask is never used: tiles
  past ``key_lengths[b]`` or above the causal diagonal of the whole block are
  not even loaded, and a masked key is skipped before its dot product;
- a NaN score at a visible position makes the whole output row NaN, a row that
  sees no key gets 0;
- dropout uses the stateless hash of :mod:`kernels._dropout` (same keep/drop
  decision as every other backend) with inverted scaling, and the row sum is
  taken before dropout;
- ``return_weights`` writes the raw scores into the weights row and normalises
  them at the end.

Shared memory (dynamic, one buffer of the input dtype, ``BLOCK_K`` keys)::

    [0, BLOCK_K*D)                   K tile, key-major: key kk at kk*D
    [BLOCK_K*D, BLOCK_K*(D+Dv))      V tile, key-major: key kk at BLOCK_K*D + kk*Dv
    [BLOCK_K*(D+Dv), +BLOCK_K*BQ)    scores, row r's score for key kk at kk*BQ + r

Every thread reads the same K/V element at the same time (a broadcast) and its
own column of the score tile (consecutive threads, consecutive words: no bank
conflict).  No warp shuffles are used, so the same kernel runs in Numba's CUDA
simulator (``NUMBA_ENABLE_CUDASIM=1``), where the tests run it with tiny tiles.

Kernels are built per dtype by :func:`kernel_source` so that every constant
has the input dtype: the float32 kernel contains no float64 instruction
(:func:`compile_ptx_all` and the tests check its PTX).  The same source serves calls with
:mod:`kernels.mods` functions (:mod:`kernels._cuda_mods` compiles it with them; here with
the identities): a tile the mask function hides from every row of the block is not
loaded, and in a partial tile a hidden key is skipped before its dot product.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import threading

import numba
import numpy as np
from numba import cuda

from . import _mods_compile as mc
from ._dropout import build_dropout_bits, dropout_threshold
from ._validate import AttentionProblem, check_options, check_qkv

#: Largest head size (D and Dv) the kernel supports: the size of its per-thread arrays.
MAX_HEAD_DIM = 256
#: Dynamic shared memory a block may use without an opt-in, in bytes.
SHARED_MEMORY_BYTES = 48 * 1024


def _simulator_enabled() -> bool:
    """True if ``numba.cuda`` is Numba's CUDA simulator."""
    try:
        from numba.cuda.core import config
    except ImportError:  # older numba-cuda keeps the flag in numba's config
        from numba.core import config
    return bool(getattr(config, "ENABLE_CUDASIM", os.environ.get("NUMBA_ENABLE_CUDASIM")))


SIMULATOR = _simulator_enabled()
#: Query rows (threads) per block; the simulator runs one Python thread per CUDA thread.
BLOCK_Q = 4 if SIMULATOR else 64
#: Keys per shared-memory tile (lowered for large head sizes to fit SHARED_MEMORY_BYTES).
BLOCK_K = 4 if SIMULATOR else 64

# Device functions are inlined into the kernel at the Numba IR level: that is also what lets
# compile_ptx_all work without a GPU (numba-cuda compiles a non-inlined device function
# for the current device's compute capability, which needs a driver).
_device = cuda.jit(device=True, inline="always")
EMPTY, FULL = mc.EMPTY, mc.FULL  # tile classes of a mask function

_dropout_bits = build_dropout_bits(_device)  # the hash every backend shares

# The simulator is not thread-safe: a launch configures the kernel object in place and swaps
# this module's ``cuda`` global for a fake one while it runs.  Its calls are serialised.
_simulator_lock = threading.RLock() if SIMULATOR else contextlib.nullcontext()


#: Partial sums of a dot product: independent accumulators (more accurate than one running
#: sum, and instruction-level parallelism on the GPU).
DOT_PARTIAL_SUMS = 8


def make_dot(F):
    """``dot(x, x_off, y, y_off, n) = Σ_d x[x_off + d] · y[y_off + d]``, a device function
    in the numba type ``F`` with ``DOT_PARTIAL_SUMS`` interleaved partial sums.

    On unscaled large logits (scale = 1, |q|, |k| ~ 6) one sequential float32 sum had 4.1x
    the error of NumPy's float32 formula; eight partial sums bring it within the tolerance.
    """
    ZERO = F(0)

    @_device
    def dot(x, x_off, y, y_off, n):
        s0 = ZERO
        s1 = ZERO
        s2 = ZERO
        s3 = ZERO
        s4 = ZERO
        s5 = ZERO
        s6 = ZERO
        s7 = ZERO
        d = 0
        while d + 8 <= n:
            a = x_off + d
            c = y_off + d
            s0 += x[a] * y[c]
            s1 += x[a + 1] * y[c + 1]
            s2 += x[a + 2] * y[c + 2]
            s3 += x[a + 3] * y[c + 3]
            s4 += x[a + 4] * y[c + 4]
            s5 += x[a + 5] * y[c + 5]
            s6 += x[a + 6] * y[c + 6]
            s7 += x[a + 7] * y[c + 7]
            d += 8
        while d < n:
            s0 += x[x_off + d] * y[y_off + d]
            d += 1
        return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))

    return dot


def tile_functions(F):
    """``(load_tile, accumulate_tile, finish_row)``: the device functions of one thread's
    online softmax in the numba type ``F``, shared by this kernel and the kernel with
    compiled mods (:mod:`kernels._cuda_mods`)."""
    ZERO = F(0)
    ONE = F(1)
    NEG_INF = F(-np.inf)
    NAN = F(np.nan)
    NO_DROPOUT = np.uint64(0)

    @_device
    def load_tile(tiles, offset, src, b, hk, j0, n_keys, t, block_q):
        """Copy rows j0 .. j0+n_keys-1 of src[b, hk] into tiles[offset:], all threads together.

        Thread t copies elements t, t + block_q, ... of the (contiguous) rows: consecutive
        threads read consecutive words.  The (key, column) of the element is advanced
        without a division per element.
        """
        width = src.shape[3]
        if width == 0:  # Dv = 0: nothing to copy
            return
        kk = t // width  # key of element idx, relative to j0
        d = t % width  # column of element idx
        step_keys = block_q // width
        step_d = block_q % width
        for idx in range(t, n_keys * width, block_q):
            tiles[offset + idx] = src[b, hk, j0 + kk, d]
            kk += step_keys
            d += step_d
            if d >= width:
                d -= width
                kk += 1

    @_device
    def accumulate_tile(acc, tiles, v_off, s_off, t, block_q, Dv, n_keys, j0, tile_max,
                        row_max, row_sum, threshold, keep_scale, seed, b, h, i):
        """Online-softmax update of row i with its scores of the tile; returns (m, ℓ)."""
        if tile_max > row_max:  # rescale what was accumulated under the old max
            correction = F(math.exp(row_max - tile_max))
            row_sum *= correction
            for d in range(Dv):
                acc[d] *= correction
            row_max = tile_max
        for kk in range(n_keys):
            score = tiles[s_off + kk * block_q + t]
            if score == NEG_INF:
                continue
            p = F(math.exp(score - row_max))
            row_sum += p  # the sum is taken before dropout
            if threshold > NO_DROPOUT:
                if _dropout_bits(seed, b, h, i, j0 + kk) < threshold:
                    continue
                p *= keep_scale
            v_base = v_off + kk * Dv
            for d in range(Dv):
                acc[d] += p * tiles[v_base + d]
        return row_max, row_sum

    @_device
    def finish_row(acc, out, weights, want_weights, b, h, i, row_max, row_sum, row_nan, lse):
        """Divide row i by its sum (0 if it saw no key, NaN if a score was NaN); its lse."""
        inv_sum = ZERO
        lse[b, h, i] = NAN if row_nan else NEG_INF
        if row_sum > ZERO:
            inv_sum = ONE / row_sum
            if not row_nan:
                lse[b, h, i] = row_max + F(math.log(row_sum))
        for d in range(out.shape[3]):
            out[b, h, i, d] = NAN if row_nan else acc[d] * inv_sum
        if want_weights:
            for j in range(weights.shape[3]):
                score = weights[b, h, i, j]
                if row_nan:
                    weights[b, h, i, j] = NAN
                elif score == NEG_INF:
                    weights[b, h, i, j] = ZERO
                else:
                    weights[b, h, i, j] = F(math.exp(score - row_max)) * inv_sum

    return load_tile, accumulate_tile, finish_row


def kernel_source(dtype, mask_fn, tile_fn, score_fn):
    """The attention kernel for ``dtype`` with the given :mod:`kernels.mods` device functions
    (element mask, tile classification, score function), as a plain Python function.

    Without mods (:func:`_kernel_source`) they are the identities: every tile FULL (no
    per-element check), the score unchanged.  All constants are created in ``dtype`` here,
    so no literal promotes float32 to float64.
    """
    F = numba.from_dtype(np.dtype(dtype))
    ZERO = F(0)
    NEG_INF = F(-np.inf)
    dot_product = make_dot(F)
    load_tile, accumulate_tile, finish_row = tile_functions(F)

    @_device
    def score_tile(q_row, tiles, s_off, t, block_q, D, n_keys, j0, mask, mask_row, mask_sj,
                   has_mask, scale, weights, want_weights, b, h, i, row_nan, check_each,
                   mask_args, score_args):
        """Scores of row i against the tile (hidden keys skipped); returns the tile max."""
        tile_max = NEG_INF
        for kk in range(n_keys):
            j = j0 + kk
            if check_each and not mask_fn(b, h, i, j, mask_args):
                tiles[s_off + kk * block_q + t] = NEG_INF  # hidden: k[j], v[j] not used
                continue
            extra = ZERO
            if has_mask:
                extra = mask[mask_row + j * mask_sj]
                if extra == NEG_INF:
                    tiles[s_off + kk * block_q + t] = NEG_INF
                    continue
            dot = dot_product(q_row, 0, tiles, kk * D, D)
            score = F(score_fn(dot * scale, b, h, i, j, score_args)) + extra
            tiles[s_off + kk * block_q + t] = score
            if want_weights:
                weights[b, h, i, j] = score
            if score > tile_max:
                tile_max = score
            elif score != score:
                row_nan = True
        return tile_max, row_nan

    def attention_kernel(q, k, v, mask, mask_sb, mask_sh, mask_si, mask_sj, has_mask,
                         key_lengths, causal, causal_offset, scale, threshold, keep_scale, seed,
                         out, weights, want_weights, block_k, lse, mask_args, score_args):
        H, Lq, D = q.shape[1], q.shape[2], q.shape[3]
        Dv = v.shape[3]
        t = cuda.threadIdx.x
        block_q = cuda.blockDim.x
        n_tiles = (Lq + block_q - 1) // block_q
        bh = cuda.blockIdx.x // n_tiles
        b = bh // H
        h = bh % H
        hk = h // (H // k.shape[1])
        i0 = (cuda.blockIdx.x % n_tiles) * block_q
        i_end = min(i0 + block_q, Lq)  # the block's rows are [i0, i_end)
        i = i0 + t
        active = i < Lq

        tiles = cuda.shared.array(0, F)
        v_off = block_k * D
        s_off = block_k * (D + Dv)
        q_row = cuda.local.array(MAX_HEAD_DIM, F)
        acc = cuda.local.array(MAX_HEAD_DIM, F)
        row_max = NEG_INF
        row_sum = ZERO
        row_nan = False
        if active:
            for d in range(D):
                q_row[d] = q[b, h, i, d]
            for d in range(Dv):
                acc[d] = ZERO
            if want_weights:
                for j in range(weights.shape[3]):
                    weights[b, h, i, j] = NEG_INF

        key_end = key_lengths[b]
        row_end = key_end
        if causal:
            key_end = min(key_end, i_end + causal_offset)
            row_end = min(row_end, i + causal_offset + 1)
        mask_row = b * mask_sb + h * mask_sh + i * mask_si

        for j0 in range(0, key_end, block_k):
            n_keys = min(block_k, key_end - j0)
            # The same answer in every thread of the block: it branches as one.
            cls = tile_fn(b, h, i0, i_end, j0, j0 + n_keys, mask_args)
            if cls == EMPTY:
                continue  # never loaded
            cuda.syncthreads()
            load_tile(tiles, 0, k, b, hk, j0, n_keys, t, block_q)
            load_tile(tiles, v_off, v, b, hk, j0, n_keys, t, block_q)
            cuda.syncthreads()
            row_keys = min(row_end - j0, n_keys)
            if active and row_keys > 0:
                tile_max, row_nan = score_tile(
                    q_row, tiles, s_off, t, block_q, D, row_keys, j0, mask, mask_row, mask_sj,
                    has_mask, scale, weights, want_weights, b, h, i, row_nan, cls != FULL,
                    mask_args, score_args)
                if tile_max != NEG_INF:
                    row_max, row_sum = accumulate_tile(
                        acc, tiles, v_off, s_off, t, block_q, Dv, row_keys, j0, tile_max,
                        row_max, row_sum, threshold, keep_scale, seed, b, h, i)

        if active:
            finish_row(acc, out, weights, want_weights, b, h, i, row_max, row_sum, row_nan, lse)

    return attention_kernel


def _kernel_source(dtype):
    """The kernel for ``dtype`` without mods (the identities compiled in)."""
    mask_fn, tile_fn = mc.identity_mask("cuda")
    return kernel_source(dtype, mask_fn, tile_fn, mc.identity_score("cuda"))


def _signature(dtype):
    """The kernel's argument types for ``dtype`` (arrays C-contiguous)."""
    F = numba.from_dtype(np.dtype(dtype))
    no_args = numba.types.Tuple(())  # mask_args, score_args: none without mods
    return _base_signature(dtype) + (numba.types.Array(F, 3, "C"), no_args, no_args)


def _base_signature(dtype):
    """The argument types every attention kernel takes, up to ``block_k`` (then come lse,
    mask_args and score_args)."""
    F = numba.from_dtype(np.dtype(dtype))
    array4 = numba.types.Array(F, 4, "C")
    i64, boolean, u64 = numba.types.int64, numba.types.boolean, numba.types.uint64
    return (
        array4, array4, array4,  # q, k, v
        numba.types.Array(F, 1, "C"), i64, i64, i64, i64, boolean,  # mask, strides, has_mask
        numba.types.Array(i64, 1, "C"), boolean, i64,  # key_lengths, causal, causal_offset
        F, u64, F, u64,  # scale, threshold, keep_scale, seed
        array4, array4, boolean,  # out, weights, want_weights
        i64,  # block_k
    )


@functools.cache
def _kernel(dtype):
    """The compiled (or, in the simulator, simulated) kernel for ``dtype``."""
    dtype = np.dtype(dtype)
    source = _kernel_source(dtype)
    if SIMULATOR:
        return cuda.jit(source)
    return cuda.jit(_signature(dtype), cache=True)(source)


def compile_ptx_all(cc=(9, 0)) -> dict[str, str]:
    """Compile every kernel to PTX for compute capability ``cc``; needs NVVM, not a GPU.

    Parameters
    ----------
    cc : tuple of int, default (9, 0)

    Returns
    -------
    dict of str to str
        ``{"attention_float32": ptx, "attention_float64": ptx}``.

    Raises
    ------
    RuntimeError
        In the CUDA simulator, which cannot compile.
    """
    if SIMULATOR:
        raise RuntimeError("compile_ptx_all needs numba-cuda with NUMBA_ENABLE_CUDASIM unset")
    ptx = {}
    for dtype in (np.float32, np.float64):
        name = f"attention_{np.dtype(dtype).name}"
        ptx[name], _ = cuda.compile_ptx(_kernel_source(dtype), _signature(dtype), cc=tuple(cc))
    return ptx


def check_supported(problem: AttentionProblem) -> None:
    """Raise ValueError if the cuda backend cannot run ``problem`` (a head size > MAX_HEAD_DIM)."""
    B, H, Hkv, Lq, Lk, D, Dv = problem.shape
    if D > MAX_HEAD_DIM or Dv > MAX_HEAD_DIM:
        raise ValueError(
            f"backend='cuda' supports head sizes up to {MAX_HEAD_DIM}; got D={D} and Dv={Dv} "
            f"(q {(B, H, Lq, D)}, k {(B, Hkv, Lk, D)}, v {(B, Hkv, Lk, Dv)}); "
            "use backend='numba' for larger heads"
        )


def _keys_per_tile(block_k: int, block_q: int, D: int, Dv: int, itemsize: int) -> int:
    """``block_k`` lowered until the K, V and score tiles fit in SHARED_MEMORY_BYTES."""
    fits = SHARED_MEMORY_BYTES // (itemsize * (D + Dv + block_q))
    return max(1, min(block_k, fits))


def _launch(problem: AttentionProblem, q, k, v, out, weights, *, stream=0,
            block_q=None, block_k=None, lse=None) -> None:
    """Launch the kernel on device arrays; ``problem`` supplies everything but the data.

    ``problem.q``, ``.k`` and ``.v`` are only read for their shapes and dtype (they may be
    zero-memory stand-ins); ``q``, ``k``, ``v``, ``out`` and ``weights`` are device arrays.
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
    dtype = problem.dtype
    block_q = min(block_q or BLOCK_Q, Lq)
    block_k = _keys_per_tile(block_k or BLOCK_K, block_q, D, Dv, dtype.itemsize)
    shared_bytes = block_k * (D + Dv + block_q) * dtype.itemsize
    n_blocks = B * H * ((Lq + block_q - 1) // block_q)

    has_mask = problem.mask is not None
    mask = problem.additive_mask().reshape(-1) if has_mask else np.zeros(1, dtype=dtype)
    mask_dev = cuda.to_device(mask, stream=stream)  # (mask size,)
    lengths_dev = cuda.to_device(problem.key_lengths_or_full(), stream=stream)  # (B,)
    mask_sb, mask_sh, mask_si, mask_sj = problem.mask_strides()
    ftype = dtype.type
    kernel, mod_args = _kernel(dtype), ((), ())
    if problem.score_mod is not None or problem.mask_mod is not None:
        from ._cuda_mods import kernel_and_arguments  # the kernel with the mods compiled in

        kernel, mod_args = kernel_and_arguments(problem, stream)
    if lse is None:
        lse = cuda.device_array((B, H, Lq), dtype=dtype, stream=stream)
    args = (
        q, k, v,
        mask_dev, mask_sb, mask_sh, mask_si, mask_sj, has_mask,
        lengths_dev, problem.causal_offset is not None, problem.causal_offset or 0,
        ftype(problem.scale), np.uint64(dropout_threshold(problem.dropout_p)),
        ftype(1.0 / (1.0 - problem.dropout_p)), np.uint64(problem.seed),
        out, weights, problem.return_weights,
        block_k, lse, *mod_args,
    )
    names = mc.user_names(problem)
    # Configured at each launch: the simulator's kernel object keeps its configuration.
    return lambda: mc.run_user_code(
        names, lambda: kernel[n_blocks, block_q, stream, shared_bytes](*args))


def run(problem: AttentionProblem, *, block_q: int | None = None, block_k: int | None = None,
        return_lse: bool = False):
    """Attention for a validated problem on the GPU; returns ``(out, weights or None)``.

    With ``return_lse``, ``(out, weights or None, lse)``, lse of shape (B, H, Lq).

    Copies the problem's NumPy arrays to the device, launches the kernel and copies the
    results back.

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
    dtype = problem.dtype
    if B * H * Lq == 0:
        out = np.empty((B, H, Lq, Dv), dtype=dtype)
        weights = np.empty((B, H, Lq, Lk), dtype=dtype)
        result = out, (weights if problem.return_weights else None)
        return result + (np.empty((B, H, Lq), dtype=dtype),) if return_lse else result

    with _simulator_lock:
        q = cuda.to_device(problem.q)  # (B, H, Lq, D)
        k = cuda.to_device(problem.k)  # (B, Hkv, Lk, D)
        v = cuda.to_device(problem.v)  # (B, Hkv, Lk, Dv)
        out = cuda.device_array((B, H, Lq, Dv), dtype=dtype)
        weights_shape = (B, H, Lq, Lk) if problem.return_weights else (1, 1, 1, 1)
        weights = cuda.device_array(weights_shape, dtype=dtype)
        lse = cuda.device_array((B, H, Lq), dtype=dtype)
        _launch(problem, q, k, v, out, weights, block_q=block_q, block_k=block_k, lse=lse)
        result = out.copy_to_host(), (weights.copy_to_host() if problem.return_weights else None)
        return result + (lse.copy_to_host(),) if return_lse else result


# --- the device-array entry point ---------------------------------------------------------


def _is_device_array(x) -> bool:
    return getattr(x, "__cuda_ndarray__", False) or hasattr(x, "__cuda_array_interface__")


def _as_device_array(name: str, x):
    """``x`` as a numba device array (no copy), or TypeError if it is not on the device."""
    if getattr(x, "__cuda_ndarray__", False):  # numba's device arrays (and the simulator's)
        return x
    if hasattr(x, "__cuda_array_interface__"):
        return cuda.as_cuda_array(x)
    raise TypeError(
        f"{name} is a {type(x).__name__}, not a device array; attention_device takes arrays "
        "on the GPU (cuda.to_device(x)); use kernels.attention for NumPy arrays"
    )


def _check_device_layout(name: str, x, letter: str) -> None:
    """4-D and C-contiguous, with a message naming the layout ``(B, H, L<letter>, D)``."""
    if x.ndim != 4:
        raise ValueError(
            f"{name} must be a 4-D (B, H, L{letter}, D) device array; got shape {tuple(x.shape)}"
        )
    if not x.is_c_contiguous():
        raise ValueError(
            f"{name} of shape {tuple(x.shape)} must be C-contiguous "
            "(copy it with cupy.ascontiguousarray or a device-to-device copy)"
        )


def _stand_in(x) -> np.ndarray:
    """A zero-memory NumPy array with the shape and dtype of device array ``x``."""
    shape = tuple(x.shape)
    stand_in = np.lib.stride_tricks.as_strided(
        np.zeros(1, dtype=x.dtype), shape, (0,) * len(shape), writeable=False
    )
    return stand_in


def _to_host(name: str, x):
    """Host copy of a small argument (mask, key_lengths) that may live on the device."""
    if x is not None and _is_device_array(x):
        return _as_device_array(name, x).copy_to_host()
    return x


def _device_problem(q, k, v, **options) -> AttentionProblem:
    """Validate the device arrays' shapes and the other arguments, without copying q, k, v."""
    for name, x, letter in (("q", q, "q"), ("k", k, "k"), ("v", v, "k")):
        _check_device_layout(name, x, letter)
    q0, k0, v0 = check_qkv(_stand_in(q), _stand_in(k), _stand_in(v))
    options["mask"] = _to_host("mask", options.get("mask"))
    options["key_lengths"] = _to_host("key_lengths", options.get("key_lengths"))
    return AttentionProblem(q=q0, k=k0, v=v0,
                            **check_options(q0.shape, k0.shape, q0.dtype, **options))


def _check_out(out, shape: tuple, dtype: np.dtype, stream):
    """The output device array: ``out`` after checking it, or a new one."""
    if out is None:
        return cuda.device_array(shape, dtype=dtype, stream=stream)
    out = _as_device_array("out", out)
    if tuple(out.shape) != shape or out.dtype != dtype or not out.is_c_contiguous():
        raise ValueError(
            f"out must be a C-contiguous device array of shape {shape} (B, H, Lq, Dv) and dtype "
            f"{dtype}; got shape {tuple(out.shape)} and dtype {out.dtype}"
        )
    return out


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
        C-contiguous, float32 or float64.
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
        weights = cuda.device_array(weights_shape, dtype=problem.dtype, stream=stream)
        _launch(problem, q, k, v, out, weights, stream=stream)
        return (out, weights) if return_weights else out


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
        weights = cuda.device_array((1, 1, 1, 1), dtype=problem.dtype, stream=stream)
        launch = _launcher(problem, q, k, v, out, weights, stream=stream)

    def locked_launch():
        with _simulator_lock:
            launch()

    return (locked_launch if SIMULATOR else launch), out
