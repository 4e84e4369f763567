"""Half-precision loads and stores for the numba CPU kernels: widen in registers, round back.

Numba has no float16 or bfloat16 arithmetic on the CPU, so the kernels receive half arrays
as their bits (:func:`kernels._dtypes.bits_view`): ``uint16`` holds bfloat16, ``int16``
holds float16.  The integer dtype is the compile-time flag: each function below is an
overload that Numba resolves by type, so a float32 or float64 kernel compiles to what it
was (every function is the identity there) and a half kernel gets its conversions inlined.

- bfloat16 -> float32: the 16 bits shifted into the top of a float32 (exact);
- float16 -> float32: LLVM's ``fpext half to float`` (exact; one ``vcvtph2ps`` with F16C);
- float32 -> bfloat16: round to nearest even on the bits (NaN stays a quiet NaN);
- float32 -> float16: LLVM's ``fptrunc float to half`` (round to nearest even, overflow to
  inf as IEEE says).

No function here copies a whole array: :func:`widen_tile` fills a caller's float32 tile
(the scratch a BLAS product reads) and returns the float input itself untouched.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

from . import cache  # noqa: F401  (before any cached function: see that module)

_BF16 = types.uint16  # the bits of a bfloat16
_F16 = types.int16  # the bits of a float16


def is_half_bits(dtype) -> bool:
    """Whether the Numba dtype ``dtype`` holds half bits (a bfloat16's or a float16's), for
    overloads that choose their code by type."""
    return dtype in (_BF16, _F16)


def is_bfloat16_bits(dtype) -> bool:
    """Whether the Numba dtype ``dtype`` holds bfloat16 bits (``uint16``)."""
    return dtype == _BF16


def widen_vector_ir(builder, bits, dtype):
    """LLVM IR: a vector of half bits (``<n x i16>``, Numba dtype ``dtype``: uint16 for
    bfloat16, int16 for float16) as ``<n x float>``, each lane widened as :func:`widen`
    widens one element (exact)."""
    n = bits.type.count
    if dtype == _BF16:
        wide = builder.zext(bits, ir.VectorType(ir.IntType(32), n))
        wide = builder.shl(wide, ir.Constant(ir.VectorType(ir.IntType(32), n), [16] * n))
        return builder.bitcast(wide, ir.VectorType(ir.FloatType(), n))
    if dtype == _F16:
        halves = builder.bitcast(bits, ir.VectorType(ir.HalfType(), n))
        return builder.fpext(halves, ir.VectorType(ir.FloatType(), n))
    raise TypeError(f"{dtype} holds no half bits")


@intrinsic
def _f16_bits_to_f32(typingctx, bits):
    """float16 bits (int16) -> float32: bitcast to LLVM half, then fpext (exact)."""
    if bits != _F16:
        return None

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(bits), codegen


@intrinsic
def _f32_to_f16_bits(typingctx, x):
    """float32 -> float16 bits (int16): fptrunc (round to nearest even), then bitcast."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return _F16(x), codegen


@intrinsic
def _bf16_bits_to_f32(typingctx, bits):
    """bfloat16 bits (uint16) -> float32: the bits shifted into the top half (exact)."""
    if bits != _BF16:
        return None

    def codegen(context, builder, signature, args):
        wide = builder.shl(builder.zext(args[0], ir.IntType(32)), ir.Constant(ir.IntType(32), 16))
        return builder.bitcast(wide, ir.FloatType())

    return types.float32(bits), codegen


@intrinsic
def _f32_as_u32(typingctx, x):
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(x), codegen


# Not inline="always": inlined by Numba into narrow's lambda, twice in one loop, it tripped
# Numba's SSA check (a NumbaIRAssumptionWarning asking to report a bug).  A call per element
# stored (O(output), not O(L²)); the bits are the same (tests/test_half.py).
@njit
def _f32_to_bf16_bits(x):
    u = np.uint64(_f32_as_u32(np.float32(x)))  # Numba's shifts widen to 64 bits anyway
    if (u & 0x7FFFFFFF) > 0x7F800000:  # NaN: keep it, quiet
        return np.uint16((u >> 16) | 0x40)
    rounding = 0x7FFF + ((u >> 16) & 1)  # to nearest, ties to even
    return np.uint16((u + rounding) >> 16)


def widen(x):
    """One loaded element in the kernel's compute dtype: float32 for half bits, else ``x``."""
    raise NotImplementedError


@overload(widen, inline="always")
def _widen_overload(x):
    if x == _BF16:
        return lambda x: _bf16_bits_to_f32(x)
    if x == _F16:
        return lambda x: _f16_bits_to_f32(x)
    return lambda x: x


def narrow(x, out):
    """``x`` as an element of array ``out``: half bits rounded to nearest even from float32
    for a half (bits) array, else ``x`` (Numba casts it on the store)."""
    raise NotImplementedError


@overload(narrow, inline="always")
def _narrow_overload(x, out):
    if out.dtype == _BF16:
        return lambda x, out: _f32_to_bf16_bits(x)
    if out.dtype == _F16:
        return lambda x, out: _f32_to_f16_bits(np.float32(x))
    return lambda x, out: x


def compute_zero(x):
    """A zero of the compute dtype of array ``x``: float32 for half bits, else x's dtype."""
    raise NotImplementedError


@overload(compute_zero, inline="always")
def _compute_zero_overload(x):
    if is_half_bits(x.dtype):
        return lambda x: np.float32(0)
    return lambda x: np.zeros(1, dtype=x.dtype)[0]


def computes_in_float32(x):
    """Whether array ``x`` is computed in float32 (it holds float32 or half bits): a
    constant of x's type, so a branch on it is compiled only for the dtypes that take it."""
    raise NotImplementedError


@overload(computes_in_float32, inline="always")
def _computes_in_float32_overload(x):
    if is_half_bits(x.dtype) or x.dtype == types.float32:
        return lambda x: True
    return lambda x: False


def compute_dtype_of(x):
    """The dtype array ``x`` is computed in, as a Numba dtype: float32 for half bits, else
    x's own dtype."""
    raise NotImplementedError


@overload(compute_dtype_of, inline="always")
def _compute_dtype_of_overload(x):
    if is_half_bits(x.dtype):
        return lambda x: np.float32
    return lambda x: x.dtype


def half_scratch(x, size):
    """A float32 scratch of ``size`` elements for widening tiles of a half (bits) array
    ``x``; an empty array of x's dtype for a float array, which needs none."""
    raise NotImplementedError


@overload(half_scratch, inline="always")
def _half_scratch_overload(x, size):
    if is_half_bits(x.dtype):
        return lambda x, size: np.empty(size, dtype=np.float32)
    return lambda x, size: np.empty(0, dtype=x.dtype)


def widen_tile(src, scratch):
    """A 2-D tile of ``src`` in the compute dtype: ``src`` itself for a float array; for
    half bits, the first ``src.size`` elements of the 1-D ``scratch`` as a C-contiguous
    tile of src's shape, filled with the widened values (the tile a BLAS reads)."""
    raise NotImplementedError


@overload(widen_tile, inline="always")
def _widen_tile_overload(src, scratch):
    if is_half_bits(src.dtype):
        def fill(src, scratch):
            n, m = src.shape
            tile = scratch[:n * m].reshape((n, m))
            for r in range(n):
                for c in range(m):
                    tile[r, c] = widen(src[r, c])
            return tile
        return fill
    return lambda src, scratch: src
