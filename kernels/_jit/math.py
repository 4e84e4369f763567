"""Numeric primitives of the numba CPU kernels: a vectorisable exp, the row-max keys, float
constants in the input's dtype, and the fastmath flag sets.

Shared by the forward kernel (:mod:`kernels.numba_cpu`), the micro-kernel path
(:mod:`kernels.numba_cpu.dense.micro`), the kernel with mods and the backward kernels.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

from . import cache  # noqa: F401  (before any cached function: see that module)

# fastmath without 'nnan'/'ninf': those flags let LLVM delete the -inf comparisons the
# masking relies on.  'reassoc' lets the row reductions vectorise.
FASTMATH = {"nsz", "arcp", "contract", "afn", "reassoc"}
# The exp functions must not be reassociated: that would merge the two-part (Cody-Waite)
# range reduction back into one product and lose its precision.  LLVM keeps each
# instruction's own flags when it inlines them into the vectorised loops.
EXACT_MATH = {"nsz", "arcp", "contract"}

# --- a vectorisable exp -------------------------------------------------------------------
# Numba has no SVML: math.exp in a loop is a scalar libm call, about ten times slower per
# float32 than the vectorised form below.  exp32 is Cephes' expf (range reduction by a
# two-part ln 2, degree-6 polynomial) and exp64 the same reduction with a degree-13 Taylor
# polynomial, written so that LLVM vectorises the loops that call them. n = round(x / ln
# 2) comes from the "magic number" 1.5 * 2**23 (2**52): adding it rounds to an integer,
# whose bits are then the low bits of the sum, so no float -> int conversion is needed.
# Max error on [-30, 0]: 1.0 ulp in float32 and in float64 (numpy's own float32 exp: 2.4
# ulp).
#
# Only for x <= 0 (or NaN), the softmax's arguments: large positive x is not handled.
# Results below the smallest normal number are flushed to 0: they are probabilities
# < 1e-38 (1e-308) next to the row maximum's 1, far below one ulp of the row sum.


# The types of a reinterpretation, either way: (Numba type, LLVM type) of the other side.
_FLOAT_OF_INT = {types.int32: (types.float32, ir.FloatType()),
                 types.int64: (types.float64, ir.DoubleType())}
_INT_OF_FLOAT = {types.float32: (types.int32, ir.IntType(32)),
                 types.float64: (types.int64, ir.IntType(64))}


def _bitcast_typing(x, other, convert):
    """Signature and codegen of an intrinsic that maps ``x`` to its partner in ``other``
    (:data:`_FLOAT_OF_INT` or :data:`_INT_OF_FLOAT`) by ``convert(builder, value,
    llvm_type)``; None (no match) for another type."""
    if x not in other:
        return None
    result, llvm_type = other[x]

    def codegen(context, builder, signature, args):
        return convert(builder, args[0], llvm_type)

    return result(x), codegen


def _cast(builder, value, llvm_type):
    return builder.bitcast(value, llvm_type)


@intrinsic
def _bits_as_float(typingctx, bits):
    """Reinterpret an int32 (int64) as the float32 (float64) with the same bits."""
    return _bitcast_typing(bits, _FLOAT_OF_INT, _cast)


@intrinsic
def _float_bits(typingctx, x):
    """Reinterpret a float32 (float64) as the int32 (int64) with the same bits."""
    return _bitcast_typing(x, _INT_OF_FLOAT, _cast)


_f32 = np.float32
_ROUND_32 = _f32(1.5 * 2**23)
_LOG2E_32 = _f32(1.44269504088896341)
_LN2_HI_32, _LN2_LO_32 = _f32(0.693359375), _f32(-2.12194440e-4)  # ln 2 in two parts
_P0, _P1, _P2, _P3, _P4, _P5 = (
    _f32(c) for c in (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
                      1.6666665459e-1, 5.0000001201e-1))
_LO_32 = _f32(-87.33654)  # exp(_LO_32) is the smallest normal float32


@njit(cache=True, fastmath=EXACT_MATH)
def exp32(x):
    """exp(x) for float32 x <= 0: 1 ulp, 0 below -87.34, NaN for NaN."""
    xc = _LO_32 if x < _LO_32 else x
    t = xc * _LOG2E_32 + _ROUND_32  # round(x / ln 2) + 1.5 * 2**23
    n = t - _ROUND_32
    r = xc - n * _LN2_HI_32
    r = r - n * _LN2_LO_32
    p = (((((_P0 * r + _P1) * r + _P2) * r + _P3) * r + _P4) * r + _P5) * r * r + r + _f32(1)
    two_to_n = _bits_as_float(np.int32((np.int64(_float_bits(t)) + 127) << 23))
    return _f32(0) if x < _LO_32 else p * two_to_n


_ROUND_64 = 1.5 * 2.0**52
_LOG2E_64 = 1.4426950408889634
_LN2_HI_64, _LN2_LO_64 = 6.93145751953125e-1, 1.42860682030941723212e-6
_LO_64 = -708.3964185322641
_T13, _T12, _T11, _T10, _T9, _T8, _T7, _T6, _T5, _T4, _T3, _T2 = (
    1.0 / float(np.prod(np.arange(1, n + 1, dtype=np.float64))) for n in range(13, 1, -1))


@njit(cache=True, fastmath=EXACT_MATH)
def exp64(x):
    """exp(x) for float64 x <= 0: 1 ulp, 0 below -708.4, NaN for NaN."""
    xc = _LO_64 if x < _LO_64 else x
    t = xc * _LOG2E_64 + _ROUND_64
    n = t - _ROUND_64
    r = xc - n * _LN2_HI_64
    r = r - n * _LN2_LO_64
    p = ((((((((((_T13 * r + _T12) * r + _T11) * r + _T10) * r + _T9) * r + _T8) * r + _T7) * r
               + _T6) * r + _T5) * r + _T4) * r + _T3) * r + _T2
    p = p * r * r + r + 1.0
    two_to_n = _bits_as_float((_float_bits(t) + 1023) << 52)
    return 0.0 if x < _LO_64 else p * two_to_n


def fast_exp(x):
    """exp of a float32 or float64 scalar inside Numba code (``exp32`` / ``exp64``)."""
    raise NotImplementedError("fast_exp is only callable from Numba-compiled code")


@overload(fast_exp)
def _fast_exp_overload(x):
    if x == types.float32:
        return lambda x: exp32(x)
    if x == types.float64:
        return lambda x: exp64(x)
    return None


# --- the row maximum -----------------------------------------------------------------------
# Taken in integers: LLVM vectorises a float max reduction only under 'nnan', which the
# -inf masking cannot have, but it vectorises an integer one (~5x faster here).
# key(x) = bits(x) ^ ((bits(x) >> 31) >>> 1) (arithmetic, then logical shift) orders the
# floats as their values (-0 < +0 aside); a NaN's key lies above +inf or below -inf by its
# sign bit, and NaNs are caught by the row sum anyway.  The map is its own inverse.


def _flip_negatives(builder, bits):
    sign = builder.ashr(bits, ir.Constant(bits.type, bits.type.width - 1))
    return builder.xor(bits, builder.lshr(sign, ir.Constant(bits.type, 1)))


@intrinsic
def max_key(typingctx, x):
    """An int32 (int64) that orders as the float32 (float64) ``x`` does (see above)."""
    return _bitcast_typing(x, _INT_OF_FLOAT,
                           lambda builder, v, t: _flip_negatives(builder, builder.bitcast(v, t)))


@intrinsic
def from_max_key(typingctx, key):
    """The float32 (float64) whose :func:`max_key` is the int32 (int64) ``key``."""
    return _bitcast_typing(key, _FLOAT_OF_INT,
                           lambda builder, v, t: builder.bitcast(_flip_negatives(builder, v), t))


# --- constants in the input's dtype ---------------------------------------------------------


def float_constants(x):
    """``(0, 1, -inf)`` in the float type of ``x`` inside Numba code (compile-time constants).

    A literal (0.0, 1, np.inf) is typed float64 or int64, which promotes float32 to float64;
    and ``-1 / 0`` computed at run time is not safe under the kernels' fastmath flags: with
    'nsz' the sign of a computed zero is unspecified, and LLVM may fold it to +inf.
    """
    raise NotImplementedError("float_constants is only callable from Numba-compiled code")


@overload(float_constants)
def _float_constants_overload(x):
    if x == types.float32:
        return lambda x: (np.float32(0), np.float32(1), np.float32(-np.inf))
    if x == types.float64:
        return lambda x: (0.0, 1.0, -np.inf)
    return None
