"""The steps of every array argument's check: a NumPy array, its dtype, its shape.

Every entry point takes NumPy arrays (and what ``np.asarray`` makes one of); an array on a
GPU (anything with ``__cuda_array_interface__``) is refused by name before any work, saying
which function takes NumPy arrays.  The dtype and shape checks raise the one message form
``"<name> has dtype <dtype>; expected <what>"`` (TypeError) and ``"<name> has shape
<shape>; expected <what>"`` (ValueError); what the argument must be is each caller's
words.
"""

from __future__ import annotations

import numpy as np

__all__ = ["as_numpy", "refuse_device_array", "require_dtype", "require_integers",
           "require_shape", "wrong_dtype", "wrong_shape"]


def refuse_device_array(name: str, x, takes: str, hint: str = "") -> None:
    """Raise a TypeError naming ``name`` if ``x`` is a device array (and no NumPy array).

    Parameters
    ----------
    name : str
        The argument, as the message names it.
    x : object
    takes : str
        The function that takes NumPy arrays, as the message names it.
    hint : str, optional
        Appended to the message (where a device-array form of the function exists).
    """
    if not isinstance(x, np.ndarray) and hasattr(x, "__cuda_array_interface__"):
        raise TypeError(f"{name} is a device array; {takes} takes NumPy arrays{hint}")


def as_numpy(name: str, x, takes: str, hint: str = "") -> np.ndarray:
    """``x`` as a NumPy array (itself if it is one), after :func:`refuse_device_array`."""
    refuse_device_array(name, x, takes, hint)
    return x if isinstance(x, np.ndarray) else np.asarray(x)


def wrong_dtype(name: str, dtype, expected: str) -> TypeError:
    """The error for argument ``name`` of dtype ``dtype`` where ``expected`` is taken."""
    return TypeError(f"{name} has dtype {dtype}; expected {expected}")


def wrong_shape(name: str, shape, expected: str) -> ValueError:
    """The error for argument ``name`` of shape ``shape`` where ``expected`` is taken."""
    return ValueError(f"{name} has shape {shape}; expected {expected}")


def require_dtype(name: str, x: np.ndarray, dtypes, expected: str) -> np.ndarray:
    """``x`` if its dtype is one of ``dtypes``, else a TypeError naming ``name``.

    Parameters
    ----------
    name : str
        The argument, as the message names it.
    x : numpy.ndarray
    dtypes : iterable of numpy.dtype
        The dtypes taken.
    expected : str
        What the message says is expected.
    """
    if x.dtype not in tuple(dtypes):
        raise wrong_dtype(name, x.dtype, expected)
    return x


def require_integers(name: str, x, expected: str = "integers") -> np.ndarray:
    """``x`` as an array of integers (never bools), else a TypeError naming ``name``."""
    arr = np.asarray(x)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise wrong_dtype(name, arr.dtype, expected)
    return arr


def require_shape(name: str, x: np.ndarray, shape: tuple, note: str = "") -> np.ndarray:
    """``x`` if its shape is ``shape``, else a ValueError naming ``name`` (``note`` after
    the expected shape)."""
    if tuple(x.shape) != tuple(shape):
        raise wrong_shape(name, tuple(x.shape), f"{tuple(shape)}{note}")
    return x
