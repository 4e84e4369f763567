"""The public import path of the ``cuda`` backend's device-array entry points.

:func:`attention_device` runs the forward kernel on arrays already on the GPU and
:func:`prepare_launch` splits it into a copy now and a launch later; both live in
:mod:`kernels.cuda.launch`.  The error that refuses a device array in
:func:`kernels.attention` names this path.  Importing this module imports numba.cuda.
"""

from __future__ import annotations

from .cuda.launch import attention_device, prepare_launch

__all__ = ["attention_device", "prepare_launch"]
