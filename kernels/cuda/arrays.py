"""Device arrays given to :func:`kernels.cuda_backend.attention_device`: their checks.

A device array is accepted as it is (Numba's, or any object with
``__cuda_array_interface__``: CuPy, PyTorch) if it is 4-D and C-contiguous; its shape and
dtype are validated as :func:`kernels.attention` validates NumPy arrays, through zero-memory
stand-ins, so nothing big is copied.  A mask or key lengths on the device are copied to
the host (they are small) to be validated.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .._problems.checks import check_options, check_qkv
from .._problems.dense import AttentionProblem


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

