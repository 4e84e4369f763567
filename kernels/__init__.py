"""Verified masked multi-head attention kernels for NumPy code.

Installed as ``attnbench.kernels``; ``import kernels`` reaches the same module where no
other package owns that name (:mod:`kernels._name`).

>>> import numpy as np
>>> from attnbench import kernels
>>> q = k = v = np.ones((2, 4, 8, 16), dtype=np.float32)   # (B, H, L, D)
>>> kernels.attention(q, k, v, causal=True).shape
(2, 4, 8, 16)

:func:`attention_backward` gives the gradients (dq, dk, dv) of ``sum(dout * attention(...))``
from the forward's ``out`` and ``lse`` (``attention(..., return_lse=True)``).

Backends: ``"reference"`` (the literal formula in NumPy, float64 accumulation: the
oracle), ``"numba"`` (fused CPU kernel, parallel) and ``"cuda"`` (numba.cuda; runs in
Numba's CUDA simulator when ``NUMBA_ENABLE_CUDASIM=1``).  Importing this package
imports neither Numba nor the CUDA driver; kernels compile on first use and are cached.

The numba backend computes its two tile products either with the BLAS or with a
register-blocked micro-kernel on keys and values packed once per head; which is faster
depends on the machine, so it is measured once per machine and dtype and stored beside
Numba's cache (like FFTW's wisdom).  :func:`plan` measures now (tens of seconds the first
time, mostly compiling); without it the BLAS path is used until a call of at least
``kernels.numba_cpu.planner.PLAN_WORK_LIMIT`` multiply-adds (e.g. B=1, H=12, L=4096, D=64)
plans at first use, announced by a ``PlanningWarning``.  :func:`attention_plan` says
what is stored, without measuring.

The package, from the bottom up (imports run one way, upwards):

- ``_jit/``: the Numba toolbox (vectorised exp, launch guards, cache stamps); no kernel;
- ``mods/``: the score and mask functions: the spec (Numba-free at import) and their
  lowering per target;
- one subpackage per backend: ``reference/``, ``numba_cpu/``, ``cuda/``; each takes a
  validated :class:`AttentionProblem` (``_problem.py``) and imports no other backend;
- ``_dispatch.py``: the one table of backends (forward, backward, decode, packed) and the
  one ``auto`` policy, through which every entry point reaches a backend;
- ``_api.py``: :func:`attention`, :func:`attention_backward`, :func:`prepare`, planning;
- ``mha.py``, ``multihead.py``, ``softmax.py``: built on the API;
- this face: imports and ``__all__`` only; imported by the short name ``kernels``, it hands
  that name to its owner instead (``_name.py``).
"""

from __future__ import annotations

if __name__ == "kernels":  # this folder by its top-level name: kernels._name says who owns it
    from ._name import hand_over

    hand_over()
else:
    from . import mods
    from ._api.decode import attention_with_kvcache
    from ._api.dense import (
        attention,
        attention_backward,
        attention_plan,
        compiled_forms,
        plan,
        plan_needed,
        prepare,
    )
    from ._api.dispatch import (
        BackendUnavailableError,
        available_backends,
        cuda_simulator_enabled,
        cuda_status,
        has_real_gpu,
    )
    from ._api.varlen import attention_varlen, attention_varlen_backward
    from ._problems.checks import causal_offset
    from ._problems.dense import AttentionProblem
    from .kvcache import KVCache
    from .merge import merge_attention_states
    from .mha import MultiHeadAttention
    from .softmax import softmax

    __all__ = [
        "attention",
        "attention_backward",
        "attention_plan",
        "plan",
        "plan_needed",
        "prepare",
        "mods",
        "softmax",
        "MultiHeadAttention",
        "AttentionProblem",
        "available_backends",
        "cuda_status",
        "has_real_gpu",
        "cuda_simulator_enabled",
        "causal_offset",
        "BackendUnavailableError",
        "attention_with_kvcache",
        "merge_attention_states",
        "KVCache",
        "attention_varlen",
        "attention_varlen_backward",
        "compiled_forms",
    ]
    __version__ = "0.1.0"
