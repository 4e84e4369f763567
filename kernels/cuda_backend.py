"""The import path of earlier releases for the ``cuda`` backend's entry points.

The backend lives in :mod:`kernels.cuda` (:mod:`kernels.cuda.launch` launches the forward
kernel); ``kernels.cuda_backend.attention_device`` and ``prepare_launch`` keep working.
Importing this module imports numba.cuda.
"""

from __future__ import annotations

from .cuda.launch import attention_device, prepare_launch

__all__ = ["attention_device", "prepare_launch"]
