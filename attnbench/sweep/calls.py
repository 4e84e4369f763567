"""What a sweep point calls: its inputs, its output gradient, and the timed function.

:func:`make_call` turns a :class:`attnbench.sweep.grid.Point` and its inputs into the
function of no arguments that :class:`attnbench.sweep.runner.PointRunner` times:

- forward: :func:`kernels.attention`, or the peer's call
  (:func:`attnbench.measure.peers.make_call`);
- backward: :func:`kernels.attention_backward` given ``out`` and ``lse`` from one forward
  call of the same backend made here, before timing (so the forward is not timed), or
  the peer's :func:`attnbench.measure.peers.make_backward_call`;
- a variant adds its score or mask function or its sinks (:mod:`attnbench.sweep.variants`);
  a peer gets it as a dense mask, or raises
  :class:`attnbench.measure.peers.UnsupportedByPeer`;
- decode and varlen points (``kind``) take their own inputs and entry points
  (:mod:`attnbench.sweep.kinds`).
"""

from __future__ import annotations

import functools

import numpy as np

from attnbench import kernels
from attnbench.measure import peers, problems
from attnbench.measure.problems import ProblemSpec
from attnbench.sweep import kinds
from attnbench.sweep.grid import MASK_KINDS, Point
from attnbench.sweep.variants import peer_kwargs, variant_kwargs

__all__ = ["make_call", "make_dout", "make_inputs"]


def make_inputs(point: Point):
    """``q, k, v`` (B, H|Hkv, L, d_k) and the masking keyword arguments of ``point``.

    Drawn by :func:`attnbench.measure.problems.make_inputs`: points that differ only in
    their backend, direction or variant get the same inputs.  Decode and varlen points:
    :func:`attnbench.sweep.kinds.make_inputs`.
    """
    if point.kind != "dense":
        return kinds.make_inputs(point)
    spec = ProblemSpec(B=point.batch, H=point.heads, Hkv=point.kv_heads, Lq=point.L,
                       D=point.d_k).with_mask_kind(point.mask)
    return problems.make_inputs(spec, point.dtype, seed=MASK_KINDS.index(point.mask))


def make_dout(point: Point, q: np.ndarray) -> np.ndarray:
    """The output gradient of a backward point: q's shape and dtype (Dv = d_k), seeded by
    the problem."""
    rng = np.random.default_rng([problems.SEED, point.L, point.d_k, point.heads, point.batch, 1])
    return rng.standard_normal(q.shape).astype(q.dtype)  # (B, H, L, d_k)


def make_call(point: Point, q, k, v, kwargs: dict):
    """The function ``point`` times, on the inputs of :func:`make_inputs`.

    For a backward point of a kernels backend the function's ``lse`` attribute holds the
    stored log-sum-exp the backward rebuilds the softmax from (None for the reference,
    which recomputes it in float64); peers' functions have none.
    """
    if point.kind != "dense":
        dout = make_dout(point, q) if point.direction == "backward" else None
        return kinds.make_call(point, q, k, v, kwargs, dout)
    if peers.is_peer(point.backend):
        kwargs = peer_kwargs(point.variant, kwargs, point.heads, point.L, q.dtype)
        if point.direction == "backward":
            return peers.make_backward_call(point.backend, q, k, v, make_dout(point, q), kwargs)
        return peers.make_call(point.backend, q, k, v, kwargs)
    kwargs = {**kwargs, **variant_kwargs(point.variant, point.heads, point.L, q.dtype)}
    if point.direction == "forward":
        return functools.partial(kernels.attention, q, k, v, backend=point.backend, **kwargs)
    out, lse = kernels.attention(q, k, v, backend=point.backend, return_lse=True, **kwargs)
    call = functools.partial(kernels.attention_backward, q, k, v, make_dout(point, q),
                             out=out, lse=lse, backend=point.backend, **kwargs)
    call.lse = None if point.backend == "reference" else lse
    return call
