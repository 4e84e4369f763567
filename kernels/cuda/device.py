"""Device functions the numba.cuda kernels share (forward, backward, with mods).

Whether ``numba.cuda`` is Numba's CUDA simulator (:data:`SIMULATOR`), the decorator that
inlines a device function into its kernel, the dropout hash, the dot product with partial
sums (:func:`make_dot`), the compensated one of the forward's scores
(:func:`make_compensated_dot`) and one thread's online softmax over a K/V tile
(:func:`tile_functions`).  Each builder takes the numba type ``F`` of the compute dtype (the
input dtype; float32 for half inputs) so that every constant has that dtype (no float64
instruction in a float32 or half kernel).
"""

from __future__ import annotations

import math
import os

import numba
import numpy as np
from numba import cuda

from .._dropout import build_dropout_bits


def _simulator_enabled() -> bool:
    """True if ``numba.cuda`` is Numba's CUDA simulator."""
    try:
        from numba.cuda.core import config
    except ImportError:  # older numba-cuda keeps the flag in numba's config
        from numba.core import config
    return bool(getattr(config, "ENABLE_CUDASIM", os.environ.get("NUMBA_ENABLE_CUDASIM")))


SIMULATOR = _simulator_enabled()

# Device functions are inlined into the kernel at the Numba IR level: that is also what lets
# compile_ptx_all work without a GPU (numba-cuda compiles a non-inlined device function
# for the current device's compute capability, which needs a driver).
_device = cuda.jit(device=True, inline="always")

_dropout_bits = build_dropout_bits(_device)  # the hash every backend shares

#: Partial sums of a dot product: independent accumulators (more accurate than one running
#: sum, and instruction-level parallelism on the GPU).
DOT_PARTIAL_SUMS = 8


@_device
def identity(x):
    """``x``: the load and store conversions of a float32 or float64 kernel."""
    return x


def make_dot(F, widen=identity):
    """``dot(x, x_off, y, y_off, n) = Σ_d x[x_off + d] · y[y_off + d]``, a device function
    in the numba type ``F`` with ``DOT_PARTIAL_SUMS`` interleaved partial sums; every element
    is loaded through the device function ``widen`` (to ``F``: :mod:`kernels.cuda.half`).

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
            s0 += widen(x[a]) * widen(y[c])
            s1 += widen(x[a + 1]) * widen(y[c + 1])
            s2 += widen(x[a + 2]) * widen(y[c + 2])
            s3 += widen(x[a + 3]) * widen(y[c + 3])
            s4 += widen(x[a + 4]) * widen(y[c + 4])
            s5 += widen(x[a + 5]) * widen(y[c + 5])
            s6 += widen(x[a + 6]) * widen(y[c + 6])
            s7 += widen(x[a + 7]) * widen(y[c + 7])
            d += 8
        while d < n:
            s0 += widen(x[x_off + d]) * widen(y[y_off + d])
            d += 1
        return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))

    return dot


def _product_error(F):
    """``e(a, b, p) = a·b - p`` exactly, for ``p`` the rounded product (TwoProduct).

    On a GPU one FMA.  Numba's simulator evaluates ``cuda.fma`` as a rounded ``a * b + c``,
    so there it is Dekker's product of the factors split in halves (each half product
    exact), which needs no FMA.
    """
    if not SIMULATOR:
        @_device
        def fma_error(a, b, p):
            return cuda.fma(a, b, -p)

        return fma_error

    split = F(2 ** ((np.finfo(numba.np.numpy_support.as_dtype(F)).nmant + 2) // 2) + 1)

    @_device
    def dekker_error(a, b, p):
        c = split * a
        a_hi = c - (c - a)
        a_lo = a - a_hi
        c = split * b
        b_hi = c - (c - b)
        b_lo = b - b_hi
        return ((a_hi * b_hi - p) + a_hi * b_lo + a_lo * b_hi) + a_lo * b_lo

    return dekker_error


def make_compensated_dot(F):
    """``dot(x, x_off, y, y_off, n)`` as :func:`make_dot`, with the rounding error of every
    product and every addition carried in a second sum (Ogita, Rump and Oishi's Dot2:
    TwoProduct by ``cuda.fma``, TwoSum): as accurate as a dot product computed in twice
    the precision and rounded, about 10 instructions per element instead of one FMA.

    The forward kernel's scores use it.  On unscaled large logits (scale = 1, |q|, |k| ~ 6)
    a row whose two largest scores nearly tie turns their last bits into its output: with
    eight partial sums the output's error was 5x the tolerance on one such draw (L = 5,
    Lk = 40, D = 128) where correctly rounded scores are within it.  (Numba's simulator
    rounds ``fma``'s product, so there TwoProduct is Dekker's, by splitting the factors:
    the same exact product error, so the simulator checks these numerics too.)
    """
    ZERO = F(0)
    product_error = _product_error(F)

    @_device
    def dot(x, x_off, y, y_off, n):
        total = ZERO
        error = ZERO
        for d in range(n):
            a = x[x_off + d]
            b = y[y_off + d]
            product = a * b
            new_total = total + product  # TwoSum(total, product)
            part = new_total - total
            error += (((total - (new_total - part)) + (product - part))
                      + product_error(a, b, product))
            total = new_total
        return total + error

    return dot


def tile_functions(F, widen=identity, narrow=identity):
    """``(load_tile, accumulate_tile, finish_row)``: the device functions of one thread's
    online softmax in the numba type ``F``, shared by this kernel and the kernel with
    compiled mods (:mod:`kernels.cuda.mods`).  ``widen`` converts a loaded K or V element to
    ``F`` and ``narrow`` an output element from ``F`` (:func:`kernels.cuda.half.conversions`:
    the identities for float32 and float64)."""
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
            tiles[offset + idx] = widen(src[b, hk, j0 + kk, d])
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
            out[b, h, i, d] = narrow(NAN if row_nan else acc[d] * inv_sum)
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

