"""Half precision in the cuda kernels: what they receive, how they widen loads and round stores.

float16 and bfloat16 are stored, never computed in (as on the CPU, :mod:`kernels._dtypes`):
a half kernel is the float32 kernel with its loads of q, k, v (and dout) widened to float32
and its stores of the output (dq, dk, dv) rounded to the input dtype, to nearest even;
lse, the mask, the scores and the weights it writes are float32.

- float16: numba.cuda has float16 arrays and conversions, so the kernel receives the
  float16 array itself; a load is ``float32(x)`` (one ``cvt.f32.f16``), a store
  ``float16(x)`` (``cvt.rn.f16.f32``, round to nearest even, overflow to inf as IEEE says).
- bfloat16: Numba does not know ml_dtypes' dtype, so the kernel receives the bits as
  ``uint16`` (:func:`kernel_view`); a load shifts them into the top half of a float32
  (exact), a store rounds the float32 bits to nearest even (a NaN stays a quiet NaN).  The
  float32 <-> uint32 reinterpretation is libdevice's ``int_as_float`` and ``float_as_int``
  on a GPU (one ``mov.b32``) and NumPy's ``view`` in Numba's CUDA simulator (which runs the
  kernel as Python); the integer rounding is the same code in both.

For float32 and float64 both conversions are the identity (inlined away: those kernels
compile to what they were).  :func:`narrowed` rounds a float32 device array (the weights
of :func:`kernels.cuda.launch.attention_device`) to a half dtype on the device.
"""

from __future__ import annotations

import functools

import numba
import numpy as np
from numba import cuda

from .._dtypes import BFLOAT16, compute_dtype
from .device import SIMULATOR, _device, identity

_U16, _U32 = numba.types.uint16, numba.types.uint32
_F16, _F32 = numba.types.float16, numba.types.float32


def storage_dtype(dtype) -> np.dtype:
    """The dtype of the arrays a kernel for ``dtype`` receives: ``uint16`` for bfloat16 (its
    bits), else ``dtype`` itself (float16 included)."""
    dtype = np.dtype(dtype)
    return np.dtype(np.uint16) if BFLOAT16 is not None and dtype == BFLOAT16 else dtype


def storage_type(dtype):
    """:func:`storage_dtype` as a Numba type (what the kernel signatures name)."""
    return numba.from_dtype(storage_dtype(dtype))


def compute_type(dtype):
    """The Numba type a kernel for ``dtype`` computes in: float32 for the half dtypes."""
    return numba.from_dtype(compute_dtype(dtype))


def kernel_view(x):
    """A NumPy or device array as the kernel receives it: a bfloat16 array as its ``uint16``
    bits (no copy), any other as it is."""
    if BFLOAT16 is not None and x.dtype == BFLOAT16:
        return x.view(np.uint16)
    return x


def user_view(x, dtype):
    """The inverse of :func:`kernel_view`: an array the kernel wrote, as ``dtype``."""
    return x.view(dtype) if x.dtype != np.dtype(dtype) else x


if SIMULATOR:
    @_device
    def _u32_as_f32(u):
        return np.uint32(u).view(np.float32)

    @_device
    def _f32_as_u32(x):
        return np.float32(x).view(np.uint32)
else:
    from numba.cuda import libdevice

    @_device
    def _u32_as_f32(u):
        return libdevice.int_as_float(numba.int32(u))

    @_device
    def _f32_as_u32(x):
        return _U32(libdevice.float_as_int(x))


@_device
def _bf16_widen(bits):
    """bfloat16 bits -> float32: the 16 bits shifted into the top half (exact)."""
    return _u32_as_f32(_U32(bits) << _U32(16))


@_device
def _bf16_narrow(x):
    """float32 -> bfloat16 bits, rounded to nearest even; a NaN stays a (quiet) NaN."""
    u = _f32_as_u32(_F32(x))
    if (u & _U32(0x7FFFFFFF)) > _U32(0x7F800000):
        return _U16((u >> _U32(16)) | _U32(0x40))
    rounding = _U32(0x7FFF) + ((u >> _U32(16)) & _U32(1))  # ties to even
    return _U16((u + rounding) >> _U32(16))


@_device
def _f16_widen(x):
    return _F32(x)


@_device
def _f16_narrow(x):
    return _F16(x)


def conversions(dtype):
    """``(widen, narrow)``: device functions from an element of a kernel's input array to
    its compute dtype, and from the compute dtype to an element of its output array."""
    dtype = np.dtype(dtype)
    if dtype == np.float16:
        return _f16_widen, _f16_narrow
    if BFLOAT16 is not None and dtype == BFLOAT16:
        return _bf16_widen, _bf16_narrow
    return identity, identity


@functools.cache
def _narrow_kernel(dtype):
    _, narrow = conversions(dtype)

    def narrow_kernel(src, dst):
        # src (float32) and dst (the storage type), both 4-D C-contiguous of one shape.
        cols = src.shape[3]
        rows = src.shape[2] * cols
        heads = src.shape[1] * rows
        i = cuda.grid(1)
        if i < src.shape[0] * heads:
            r = i % heads
            b, h, row, col = i // heads, r // rows, (r % rows) // cols, r % cols
            dst[b, h, row, col] = narrow(src[b, h, row, col])

    return cuda.jit(narrow_kernel)


#: Threads per block of the rounding kernel.
NARROW_BLOCK = 4 if SIMULATOR else 256


def narrowed(x, dtype, stream=0):
    """The 4-D float32 device array ``x`` rounded to the half ``dtype`` (to nearest even) in
    a new device array; ``x`` itself for any other dtype.

    Parameters
    ----------
    x : device array, 4-D, C-contiguous
    dtype : dtype-like
    stream : numba stream or 0

    Returns
    -------
    device array of ``dtype``
    """
    dtype = np.dtype(dtype)
    if compute_dtype(dtype) == dtype:
        return x
    result = cuda.device_array(x.shape, dtype=dtype, stream=stream)
    if x.size:
        n_blocks = (x.size + NARROW_BLOCK - 1) // NARROW_BLOCK
        _narrow_kernel(dtype)[n_blocks, NARROW_BLOCK, stream](x, kernel_view(result))
    return result
