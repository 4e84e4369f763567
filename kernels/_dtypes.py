"""The dtypes the kernels take, Numba-free: float32, float64 and the half dtypes.

Half precision (``np.float16`` and ``ml_dtypes.bfloat16``) is stored, never computed in:
every backend widens half loads to float32, accumulates in float32 and rounds its stores
back (round to nearest even).  Numba has no half arithmetic on the CPU, so the numba
backend receives the bits as 16-bit integers (:func:`bits_view`): ``uint16`` for
bfloat16, ``int16`` for float16, so that the integer dtype is the compile-time flag
that says how to widen them (:mod:`kernels._jit.half`).

``ml_dtypes`` (the package JAX uses) provides bfloat16 for NumPy; where it is missing,
bfloat16 is reported as unavailable (:func:`bfloat16_dtype` is None) and float16 still works.
"""

from __future__ import annotations

import numpy as np

try:  # bfloat16 for NumPy
    import ml_dtypes as _ml_dtypes
except ImportError:  # pragma: no cover - ml_dtypes is a dependency
    _ml_dtypes = None

FLOAT16 = np.dtype(np.float16)
#: ``ml_dtypes.bfloat16`` as a NumPy dtype, or None where ml_dtypes is not installed.
BFLOAT16 = None if _ml_dtypes is None else np.dtype(_ml_dtypes.bfloat16)
#: The half dtypes available here.
HALF_DTYPES = (FLOAT16,) if BFLOAT16 is None else (FLOAT16, BFLOAT16)
#: The dtypes computed in their own precision (the half dtypes are computed in float32).
FULL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
#: Every dtype q, k and v of every entry point may have (all three the same).
SUPPORTED_DTYPES = FULL_DTYPES + HALF_DTYPES


def bfloat16_dtype():
    """``ml_dtypes.bfloat16`` as a dtype, or None where ml_dtypes is missing.

    Returns
    -------
    numpy.dtype or None
    """
    return BFLOAT16


def is_half(dtype) -> bool:
    """True for float16 and bfloat16 (stored in 16 bits, computed in float32).

    Parameters
    ----------
    dtype : dtype-like
        The dtype to test.

    Returns
    -------
    bool
    """
    return _named_bfloat16(dtype) or np.dtype(dtype) in HALF_DTYPES


def _named_bfloat16(dtype) -> bool:
    return isinstance(dtype, str) and dtype == "bfloat16"


def compute_dtype(dtype) -> np.dtype:
    """The dtype a problem of ``dtype`` is computed in: float32 for the half dtypes, else
    ``dtype`` itself.  lse and the accumulators have it.

    Parameters
    ----------
    dtype : dtype-like
        The dtype, or a name such as "bfloat16", to test.

    Returns
    -------
    numpy.dtype
    """
    return np.dtype(np.float32) if is_half(dtype) else np.dtype(dtype)


def as_dtype(name) -> np.dtype:
    """``np.dtype(name)``, also for ``"bfloat16"`` (through ml_dtypes); a ValueError
    saying so where ml_dtypes is missing.

    Parameters
    ----------
    name : dtype-like or str

    Returns
    -------
    numpy.dtype
    """
    if _named_bfloat16(name):
        if BFLOAT16 is None:
            raise ValueError("bfloat16 is unavailable: it needs the ml_dtypes package "
                             "(pip install ml_dtypes); float16 works without it")
        return BFLOAT16
    return np.dtype(name)


def bits_view(x: np.ndarray) -> np.ndarray:
    """A half array as its bits (no copy): bfloat16 as ``uint16``, float16 as ``int16``;
    any other array as it is.

    Parameters
    ----------
    x : ndarray

    Returns
    -------
    ndarray
    """
    if x.dtype == FLOAT16:
        return x.view(np.int16)
    if BFLOAT16 is not None and x.dtype == BFLOAT16:
        return x.view(np.uint16)
    return x


def bits_dtype(dtype) -> np.dtype:
    """The dtype of :func:`bits_view` of an array of ``dtype``.

    Parameters
    ----------
    dtype : dtype-like
        The floating dtype whose bit pattern is wanted.

    Returns
    -------
    numpy.dtype
    """
    dtype = np.dtype(dtype)
    if dtype == FLOAT16:
        return np.dtype(np.int16)
    if BFLOAT16 is not None and dtype == BFLOAT16:
        return np.dtype(np.uint16)
    return dtype


def _finfo(dtype):
    """``np.finfo`` of ``dtype``, or ml_dtypes' for bfloat16 (which NumPy's does not know)."""
    dtype = np.dtype(dtype)
    if BFLOAT16 is not None and dtype == BFLOAT16:
        return _ml_dtypes.finfo(dtype)
    return np.finfo(dtype)


def eps(dtype) -> float:
    """Machine epsilon of ``dtype``, the half dtypes included (``np.finfo`` does not know
    bfloat16).

    Parameters
    ----------
    dtype : dtype-like
        The dtype whose epsilon is wanted.

    Returns
    -------
    float
    """
    return float(_finfo(dtype).eps)


def largest(dtype) -> float:
    """Largest finite value of ``dtype`` (65504 for float16), the half dtypes included.

    Parameters
    ----------
    dtype : dtype-like
        The dtype whose largest value is wanted.

    Returns
    -------
    float
    """
    return float(_finfo(dtype).max)


def rounded_to(x, dtype):
    """``x`` (float32, or None) rounded to ``dtype`` where that is a half dtype (to nearest
    even), else ``x`` itself.

    Parameters
    ----------
    x : ndarray or None
    dtype : dtype-like

    Returns
    -------
    ndarray or None
    """
    if x is None or not is_half(dtype):
        return x
    return x.astype(dtype)
