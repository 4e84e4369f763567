"""The first step of every array argument's check: a NumPy array, never a device array.

Every entry point takes NumPy arrays (and what ``np.asarray`` makes one of); an array on a
GPU (anything with ``__cuda_array_interface__``) is refused by name before any work, saying
which function takes NumPy arrays.  The dtype and shape checks that follow are each entry
point's own (their messages say what that argument must be).
"""

from __future__ import annotations

import numpy as np

__all__ = ["as_numpy", "refuse_device_array"]


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
