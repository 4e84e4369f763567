"""What a sweep point of each kind calls: the dense prefill, a decode step, a packed batch.

A point's ``kind`` (:data:`attnbench.sweep.grid.KINDS`) names the entry point it times;
this module holds, per kind, what the runner needs: the inputs, the timed call, the
oracle, the work (FLOPs, score entries, bytes read) and what cannot run.

- ``dense``: L queries against L keys, :func:`kernels.attention` (and its backward).
- ``decode``: one new query per sequence (Lq = 1) against a full contiguous cache of L
  keys per sequence, :func:`kernels.attention_with_kvcache` with ``cache_seqlens = L``
  and nothing appended (the cache is not written, so every call is the same step).  The
  query is at position L − 1 and sees the whole cache, so the peers get the dense call
  with Lq = 1 and no mask.  A decode step reads every key and value once: it is bound by
  memory bandwidth, and its row says the bytes of K and V it read (:func:`bytes_read`)
  and the rate.  Forward only; mask ``none``; variants ``none``, ``alibi``, ``softcap``
  (a mask function's FLOP count is written for Lq = Lk).
- ``varlen``: a packed batch of ``batch`` sequences of lengths L, L/2, L/4, ... (at least
  1, :func:`varlen_lengths`), self-attention within each, :func:`kernels.attention_varlen`
  (and its backward); mask ``none`` or ``causal``.  Its oracle is the dense oracle of each
  sequence alone, concatenated.  No peer has a packed-batch entry point.

Both entry points take float16 and bfloat16 as well as float32 and float64; the sweep
times both kinds on the CPU only.
"""

from __future__ import annotations

import functools

import numpy as np

from attnbench import kernels
from attnbench.kernels._problems.decode_checks import check_decode_args
from attnbench.measure import peers
from attnbench.measure.flops import attention_flops, backward_flops
from attnbench.measure.grad_oracle import gradient_oracle
from attnbench.measure.implementations import names
from attnbench.measure.oracle import decode_oracle, oracle, tolerance
from attnbench.measure.problems import SEED
from attnbench.sweep.grid import Point, parse_variant
from attnbench.sweep.variants import variant_kwargs

__all__ = ["DECODE_VARIANTS", "bytes_read", "make_call", "make_inputs", "oracle_of",
           "point_flops", "score_entries", "skip_reason", "varlen_lengths"]

#: Variants a decode point takes (mask functions are not: see the module docstring).
DECODE_VARIANTS = ("none", "alibi", "softcap")
#: Mask kinds a varlen point takes (within each sequence).
VARLEN_MASKS = ("none", "causal")
_KIND_SEED = {"decode": 23, "varlen": 24}  # their inputs never equal a dense point's


def varlen_lengths(L: int, batch: int) -> np.ndarray:
    """The sequence lengths of a varlen point: ``L, L/2, L/4, ...`` (at least 1), (batch,).

    >>> varlen_lengths(4096, 8).tolist()
    [4096, 2048, 1024, 512, 256, 128, 64, 32]
    """
    return np.array([max(1, L >> b) for b in range(batch)], dtype=np.int64)


def skip_reason(point: Point) -> str:
    """Why the point's kind cannot run it, or ``""`` (dense points: always ``""``)."""
    if point.kind == "dense":
        return ""
    if point.backend in names(device="gpu"):
        return f"skipped: the sweep times {point.kind} points on the CPU only"
    variant = parse_variant(point.variant)[0]
    if point.kind == "decode":
        if point.direction == "backward":
            return "skipped: a decode step has no backward pass in the sweep"
        if point.mask != "none":
            return ("skipped: a decode point's query sees its whole cache (mask none); "
                    f"not {point.mask}")
        if point.variant not in DECODE_VARIANTS:
            return (f"skipped: decode points take the variants {', '.join(DECODE_VARIANTS)}; "
                    f"not {point.variant}")
        return ""
    if peers.is_peer(point.backend):
        return "skipped: a peer has no packed-batch (varlen) entry point"
    if point.mask not in VARLEN_MASKS:
        return (f"skipped: varlen points take the masks {', '.join(VARLEN_MASKS)} (within "
                f"each sequence); not {point.mask}")
    if variant == "documents":
        return "skipped: a packed batch is its own documents (variant documents-N)"
    return ""


def _rng(point: Point) -> np.random.Generator:
    return np.random.default_rng([SEED, _KIND_SEED[point.kind], point.L, point.d_k,
                                  point.heads, point.kv_heads, point.batch])


def _draw(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)  # drawn in float64: one problem, any dtype


def make_inputs(point: Point):
    """``q, k, v`` and the keyword arguments of a decode or varlen point.

    decode: q (B, H, 1, D), the caches (B, Hkv, L, D), ``{"cache_seqlens": [L] * B}``.
    varlen: q (total, H, D), k and v (total, Hkv, D),
    ``{"cu_seqlens": (B + 1,), "causal": bool}``.  Seeded by the problem: points that
    differ in backend, direction or variant get the same arrays.
    """
    rng, dtype = _rng(point), np.dtype(point.dtype)
    H, Hkv, D = point.heads, point.kv_heads, point.d_k
    if point.kind == "decode":
        B, L = point.batch, point.L
        q = _draw(rng, (B, H, 1, D), dtype)
        k_cache, v_cache = (_draw(rng, (B, Hkv, L, D), dtype) for _ in range(2))
        return q, k_cache, v_cache, {"cache_seqlens": np.full(B, L, dtype=np.int64)}
    lengths = varlen_lengths(point.L, point.batch)
    total = int(lengths.sum())
    q = _draw(rng, (total, H, D), dtype)
    k, v = (_draw(rng, (total, Hkv, D), dtype) for _ in range(2))
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return q, k, v, {"cu_seqlens": cu, "causal": point.mask == "causal"}


def make_call(point: Point, q, k, v, kwargs: dict, dout=None):
    """The function a decode or varlen point times (``dout``: a backward point's output
    gradient).  A backward call's ``lse`` attribute holds the stored log-sum-exp (None for
    the reference), as :func:`attnbench.sweep.calls.make_call`'s."""
    extra = variant_kwargs(point.variant, point.heads, point.L, q.dtype)
    if point.kind == "decode":
        if peers.is_peer(point.backend):  # the same step as a dense call: Lq = 1, no mask
            return peers.make_call(point.backend, q, k, v, {})
        return functools.partial(kernels.attention_with_kvcache, q, k, v,
                                 cache_seqlens=kwargs["cache_seqlens"], backend=point.backend,
                                 **extra)
    cu, causal = kwargs["cu_seqlens"], kwargs["causal"]
    keywords = dict(causal=causal, backend=point.backend, **extra)
    if point.direction == "forward":
        return functools.partial(kernels.attention_varlen, q, k, v, cu, cu, **keywords)
    out, lse = kernels.attention_varlen(q, k, v, cu, cu, return_lse=True, **keywords)
    call = functools.partial(kernels.attention_varlen_backward, q, k, v, dout, cu, cu,
                             out=out, lse=lse, **keywords)
    call.lse = None if point.backend == "reference" else lse
    return call


def _sequences(kwargs: dict):
    cu = kwargs["cu_seqlens"]
    return [(int(cu[b]), int(cu[b + 1])) for b in range(len(cu) - 1)]


def _dense(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x.transpose(1, 0, 2)[None])  # (L, H, D) -> (1, H, L, D)


def _packed(x: np.ndarray) -> np.ndarray:
    return x[0].transpose(1, 0, 2)  # (1, H, L, D) -> (L, H, D)


def oracle_of(point: Point, q, k, v, kwargs: dict, dout=None):
    """The oracle of a decode or varlen point, as the runner's dense one.

    Forward: ``(exact, tolerance)`` with exact in the point's output layout.  Backward
    (varlen): ``(exact, plain)``, each the gradients (``dq, dk, dv`` and, with sinks,
    ``dsinks``) in the packed layout, from the dense gradient oracle of each sequence.
    """
    extra = variant_kwargs(point.variant, point.heads, point.L, q.dtype)
    if point.kind == "decode":
        problem = check_decode_args(q, k, v, cache_seqlens=kwargs["cache_seqlens"], **extra)[0]
        (exact, _), (plain, _) = decode_oracle(problem)
        return exact, tolerance(exact, plain, q.dtype)
    parts = []
    for start, stop in _sequences(kwargs):
        if stop == start:
            continue
        problem = kernels.prepare(*(_dense(x[start:stop]) for x in (q, k, v)),
                                  causal=kwargs["causal"], **extra)
        if point.direction == "backward":
            parts.append(gradient_oracle(problem, _dense(dout[start:stop])))
        else:
            parts.append(oracle(problem))
    if point.direction == "forward":
        exact, plain = (np.concatenate([_packed(part[i]) for part in parts]) for i in (0, 1))
        return exact, tolerance(exact, plain, q.dtype)
    return tuple(_joined([part[i] for part in parts]) for i in (0, 1))


def _joined(gradients: list[tuple]) -> tuple:
    """Per-sequence ``(dq, dk, dv[, dsinks])`` joined: the first three packed, dsinks summed."""
    joined = [np.concatenate([_packed(g[i]) for g in gradients]) for i in range(3)]
    if len(gradients[0]) > 3:
        joined.append(np.sum([g[3] for g in gradients], axis=0))
    return tuple(joined)


def point_flops(point: Point, kwargs: dict) -> int:
    """FLOPs of the point's call (visible pairs only, :mod:`attnbench.measure.flops`)."""
    B, H, L, D = point.batch, point.heads, point.L, point.d_k
    count = backward_flops if point.direction == "backward" else attention_flops
    mask_mod = variant_kwargs(point.variant, H, L).get("mask_mod")
    if point.kind == "dense":
        return count(B, H, L, L, D, causal=kwargs.get("causal", False),
                     key_lengths=kwargs.get("key_lengths"), mask=kwargs.get("mask"),
                     mask_mod=mask_mod)
    if point.kind == "decode":  # the query sees the whole cache
        return count(B, H, 1, L, D)
    return sum(count(1, H, n, n, D, causal=kwargs["causal"], mask_mod=mask_mod)
               for n in varlen_lengths(L, B).tolist())


def score_entries(point: Point) -> int:
    """Score entries the reference (and the oracle) build: B·H·Lq·Lk, per sequence."""
    if point.kind == "decode":
        return point.batch * point.heads * point.L
    if point.kind == "varlen":
        return point.heads * int((varlen_lengths(point.L, point.batch) ** 2).sum())
    return point.batch * point.heads * point.L * point.L


def bytes_read(point: Point) -> float:
    """Bytes of K and V a decode step reads (each key and value once), else NaN."""
    if point.kind != "decode":
        return np.nan
    itemsize = np.dtype(point.dtype).itemsize
    return float(point.batch * point.kv_heads * point.L * 2 * point.d_k * itemsize)
