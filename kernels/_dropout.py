"""The stateless dropout hash shared by every backend.

Whether attention weight (b, h, i, j) is dropped depends only on
``(seed, b, h, i, j)`` through a 32-bit integer hash, so the reference, the
Numba CPU kernel and the CUDA kernel drop exactly the same weights for the same
seed, in any order and with any tiling.  The functions below use only integer
operators on ``uint64`` values, which lets one source serve three compilers:
NumPy (vectorised over broadcast index arrays), ``numba.njit`` and
``numba.cuda.jit(device=True)``.
"""

from __future__ import annotations

import numpy as np

_MASK32 = np.uint64(0xFFFFFFFF)
_GOLDEN = np.uint64(0x9E3779B9)
_C1 = np.uint64(0x7FEB352D)
_C2 = np.uint64(0x846CA68B)
_S15 = np.uint64(15)
_S16 = np.uint64(16)
_S8 = np.uint64(8)
#: The hash's 24 high bits are compared with a threshold: p is quantised to 2**-24.
THRESHOLD_BITS = 24


def _mix32(x):
    """Chris Wellons' ``lowbias32`` integer hash of a value in [0, 2**32)."""
    x ^= x >> _S16
    x = (x * _C1) & _MASK32
    x ^= x >> _S15
    x = (x * _C2) & _MASK32
    x ^= x >> _S16
    return x


def build_dropout_bits(jit=None):
    """Return ``dropout_bits(seed, b, h, i, j)`` compiled with ``jit``.

    ``jit`` is ``None`` for plain NumPy, ``numba.njit`` for the CPU backend or
    ``numba.cuda.jit(device=True)`` for the CUDA backend: the same source serves all.
    The function returns 24 pseudo-random bits for attention weight (b, h, i, j).
    """
    jit = jit if jit is not None else (lambda f: f)
    mix32 = jit(_mix32)

    @jit
    def absorb(x, value):
        return mix32((x + np.uint64(value) + _GOLDEN) & _MASK32)

    @jit
    def dropout_bits(seed, b, h, i, j):
        x = mix32(np.uint64(seed) & _MASK32)
        x = absorb(absorb(absorb(absorb(x, b), h), i), j)
        return x >> _S8

    return dropout_bits


dropout_bits = build_dropout_bits()


def dropout_threshold(p: float) -> int:
    """The integer threshold below which :func:`dropout_bits` means "drop" for probability p."""
    return int(round(p * (1 << THRESHOLD_BITS)))


def keep_mask(seed: int, p: float, shape: tuple[int, int, int, int]) -> np.ndarray:
    """Boolean keep-mask of shape (B, H, Lq, Lk), vectorised in NumPy (for the reference).

    Materialises (B, H, Lq, Lk): for the reference and tests only.
    """
    B, H, Lq, Lk = shape
    b, h, i, j = (
        np.arange(n, dtype=np.uint64).reshape([-1 if a == ax else 1 for a in range(4)])
        for ax, n in enumerate((B, H, Lq, Lk))
    )
    return dropout_bits(seed, b, h, i, j) >= np.uint64(dropout_threshold(p))
