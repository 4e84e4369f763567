"""Packed variable-length batches: :func:`attention_varlen` and :func:`attention_varlen_backward`
(FlashAttention's ``flash_attn_varlen_func``; xFormers' ``BlockDiagonalMask.from_seqlens``).

The numba backend runs its own tasks over (sequence, head, block) with no padded row or key
(:mod:`kernels.numba_cpu.varlen.blocks`).  The reference and cuda backends run each sequence as a
dense call (:func:`_dense_call`): a batch of B entries, all but entry b empty
(``key_lengths`` 0, zero queries), so that the mods and the dropout hash see batch index b.
That is the definition of the result (each sequence alone, batch index b), computed
literally; its cost is B times a sequence's rows in memory and (on cuda) in launches, so it
is meant for the oracle and for small batches, not for speed.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .._dtypes import compute_dtype
from .._problems.arrays import (
    as_numpy,
    require_dtype,
    require_integers,
    require_shape,
    wrong_shape,
)
from .._problems.checks import (
    as_float_array,
    causal_offset,
    check_backend,
    check_dropout,
    check_qkv,
)
from .._problems.sinks import check_sinks, keys_only_lse, merge_sinks, sink_gradient
from .._problems.varlen import VarlenProblem
from .dense import attention, attention_backward
from .dispatch import entry_module, resolve

__all__ = ["attention_varlen", "attention_varlen_backward"]


def _check_cu_seqlens(name: str, cu, total: int, n_seq: int | None) -> np.ndarray:
    cu = require_integers(name, cu, "integers (int32 or int64)")
    if cu.ndim != 1 or cu.shape[0] < 1:
        raise wrong_shape(name, cu.shape, "(B + 1,) offsets")
    if n_seq is not None and cu.shape[0] != n_seq + 1:
        raise wrong_shape(name, cu.shape, f"({n_seq + 1},), the length "
                          "of cu_seqlens_q (one sequence of queries per sequence of keys)")
    cu = cu.astype(np.int64)
    if cu[0] != 0:
        raise ValueError(f"{name} must start at 0; got {cu[0]}")
    if (np.diff(cu) < 0).any():
        raise ValueError(f"{name} must be non-decreasing; got {cu.tolist()[:20]}")
    if cu[-1] != total:
        raise ValueError(f"{name} ends at {cu[-1]}; expected the total number of rows, {total}")
    return np.ascontiguousarray(cu)


def _check_max(name: str, given, lengths: np.ndarray):
    if given is None:
        return
    if isinstance(given, bool) or not isinstance(given, int | np.integer):
        raise TypeError(f"{name} must be an int or None; got {type(given).__name__}")
    if lengths.size and given < lengths.max():
        raise ValueError(f"{name}={given} is less than the longest sequence, {lengths.max()}")


def prepare_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *, max_seqlen_q=None,
                   max_seqlen_k=None, causal=False, scale=None, dropout_p=0.0, seed=None,
                   score_mod=None, mask_mod=None, sinks=None) -> VarlenProblem:
    """Validate the arguments of :func:`attention_varlen`; nothing runs.

    Parameters
    ----------
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale,
    dropout_p, seed, score_mod, mask_mod, sinks
        As :func:`attention_varlen`.

    Returns
    -------
    VarlenProblem
    """
    arrays = []
    for name, x in (("q", q), ("k", k), ("v", v)):
        x = as_float_array(name, x)
        if x.ndim != 3:
            raise wrong_shape(name, x.shape, "(total, heads, head size)")
        arrays.append(x)
    # As (heads, total, head size), the dense checks apply (dtypes, D, heads, keys = values).
    q, k, v = (x.transpose(1, 0, 2) for x in check_qkv(*(x.transpose(1, 0, 2) for x in arrays)))
    cu_q = _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0], None)
    cu_k = _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, k.shape[0], len(cu_q) - 1)
    _check_max("max_seqlen_q", max_seqlen_q, np.diff(cu_q))
    _check_max("max_seqlen_k", max_seqlen_k, np.diff(cu_k))
    causal_offset(causal, 1, 1)  # ValueError for anything but the four forms
    causal = False if causal is None or causal is False or causal is np.False_ else (
        "bottom-right" if causal == "bottom-right" else "top-left")
    D = q.shape[2]
    if scale is None:
        scale = 1.0 / np.sqrt(D)
    elif isinstance(scale, bool) or not isinstance(scale, int | float | np.floating):
        raise TypeError(f"scale must be a real number or None; got {type(scale).__name__}")
    elif not np.isfinite(scale):
        raise ValueError(f"scale must be finite; got {scale}")
    dropout_p, seed = check_dropout(dropout_p, seed)
    problem = VarlenProblem(
        q=np.ascontiguousarray(q), k=np.ascontiguousarray(k), v=np.ascontiguousarray(v),
        cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=causal, scale=float(scale),
        dropout_p=dropout_p, seed=seed, sinks=check_sinks(sinks, q.shape[1], q.dtype))
    if score_mod is None and mask_mod is None:
        return problem
    from .. import mods

    score = None if score_mod is None else mods.as_score_mod(score_mod)
    mask = None if mask_mod is None else mods.as_mask_mod(mask_mod)
    shape = problem.mods_problem()
    for mod in (score, mask):
        if mod is not None:
            mod.check(*shape.shape[:2], *shape.shape[3:5])
    if score is not None:
        score.element("cpu", compute_dtype(problem.dtype))  # float32 for half inputs
    return replace(problem, score_mod=score, mask_mod=mask)


def _dense_inputs(problem: VarlenProblem, b: int, *arrays):
    """Sequence b's rows of each packed array (rows, H, X) as a dense batch of B entries
    (B, H, rows, X), zero but for entry b."""
    B = problem.n_seq
    dense = []
    for x, cu in arrays:
        rows = x[cu[b]:cu[b + 1]].transpose(1, 0, 2)  # (H, rows, X)
        full = np.zeros((B,) + rows.shape, dtype=x.dtype)
        full[b] = rows
        dense.append(full)
    return dense


def _dense_keywords(problem: VarlenProblem, b: int) -> dict:
    key_lengths = np.zeros(problem.n_seq, dtype=np.int64)
    key_lengths[b] = problem.lengths_k[b]
    return dict(causal=problem.causal, key_lengths=key_lengths, scale=problem.scale,
                dropout_p=problem.dropout_p, seed=problem.seed, score_mod=problem.score_mod,
                mask_mod=problem.mask_mod)


def _dense_call(problem: VarlenProblem, name: str):
    """Each sequence as a dense call of the backend ``name``: ``(out, lse)``, no sinks."""
    H, _, _, Dv = problem.heads
    out = np.zeros((problem.q.shape[0], H, Dv), dtype=problem.dtype)
    lse = np.full((H, problem.q.shape[0]), -np.inf, dtype=compute_dtype(problem.dtype))
    cu_q, cu_k = problem.cu_seqlens_q, problem.cu_seqlens_k
    for b in range(problem.n_seq):
        if problem.lengths_q[b] == 0 or problem.lengths_k[b] == 0:
            continue  # no rows, or rows that see no key (out 0, lse -inf as initialised)
        q, k, v = _dense_inputs(problem, b, (problem.q, cu_q), (problem.k, cu_k),
                                (problem.v, cu_k))
        o, l = attention(q, k, v, return_lse=True, backend=name, **_dense_keywords(problem, b))
        out[cu_q[b]:cu_q[b + 1]] = o[b].transpose(1, 0, 2)
        lse[:, cu_q[b]:cu_q[b + 1]] = l[b]
    return out, lse


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *, max_seqlen_q=None,
                     max_seqlen_k=None, causal=False, scale=None, dropout_p=0.0, seed=None,
                     score_mod=None, mask_mod=None, sinks=None, return_lse=False,
                     backend="auto"):
    """Attention over a packed batch of sequences of different lengths (no padding).

    Sequence b is query rows ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]`` against key rows
    ``cu_seqlens_k[b]:cu_seqlens_k[b + 1]``; the result equals :func:`kernels.attention` on
    each sequence alone with batch index b (for the mods and the dropout hash).

    Parameters
    ----------
    q : ndarray, shape (total_q, H, D)
        Packed queries: float32, float64, float16 or ``ml_dtypes.bfloat16`` (half inputs
        are computed in float32, as :func:`kernels.attention` computes them).
    k : ndarray, shape (total_k, Hkv, D)
        Packed keys, q's dtype; H a multiple of Hkv (GQA/MQA).
    v : ndarray, shape (total_k, Hkv, Dv)
        Packed values, q's dtype.
    cu_seqlens_q, cu_seqlens_k : array_like of int, shape (B + 1,)
        Offsets of the sequences: start at 0, non-decreasing, end at total_q (total_k).
        Sequences may be empty.
    max_seqlen_q, max_seqlen_k : int, optional
        The longest lengths (FlashAttention's arguments); checked, not needed.
    causal : bool or {"top-left", "bottom-right"}, default False
        Within each sequence: ``True``/``"top-left"``: query i sees keys j <= i;
        ``"bottom-right"``: j <= i + Lk_b - Lq_b.
    scale, dropout_p, seed : optional
        As :func:`kernels.attention`.
    score_mod, mask_mod : optional
        As :func:`kernels.attention`; they receive b = the sequence index and positions
        within the sequence (bound data is checked against B sequences of the longest
        lengths).
    sinks : ndarray, shape (H,), optional
        As :func:`kernels.attention` (in q's dtype).
    return_lse : bool, default False
        Also return the log-sum-exp, shape (H, total_q).
    backend : {"auto", "reference", "numba", "cuda"}, default "auto"
        ``"numba"`` (and ``"auto"``) computes Σ_b Lq_b · Lk_b pairs and no padding;
        ``"reference"`` and ``"cuda"`` run each sequence as a dense call (see the module).

    Returns
    -------
    out : ndarray, shape (total_q, H, Dv), dtype of q
    lse : ndarray, shape (H, total_q)
        Only if ``return_lse``; q's dtype, float32 for half inputs.

    Raises
    ------
    TypeError, ValueError
        Bad input, naming the argument (``cu_seqlens_q`` not starting at 0, decreasing,
        not ending at the total, not integers, of the wrong length; bad ``sinks``).
    """
    problem = prepare_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                             max_seqlen_k=max_seqlen_k, causal=causal, scale=scale,
                             dropout_p=dropout_p, seed=seed, score_mod=score_mod,
                             mask_mod=mask_mod, sinks=sinks)
    if not isinstance(return_lse, bool | np.bool_):
        raise TypeError(f"return_lse must be a bool; got {type(return_lse).__name__}")
    out, lse = _forward(problem, resolve(check_backend(backend), problem, "varlen"))
    if problem.sinks is not None:
        out, lse, _ = merge_sinks(out.transpose(1, 0, 2), lse, problem.sinks, 0)
        out = np.ascontiguousarray(out.transpose(1, 0, 2))
    return (out, lse) if return_lse else out


def _forward(problem: VarlenProblem, name: str):
    packed = entry_module(name, "varlen")
    return _dense_call(problem, name) if packed is None else packed.run(problem)


def attention_varlen_backward(q, k, v, dout, cu_seqlens_q, cu_seqlens_k, *, out=None,
                              lse=None, max_seqlen_q=None, max_seqlen_k=None, causal=False,
                              scale=None, dropout_p=0.0, seed=None, score_mod=None,
                              mask_mod=None, sinks=None, backend="auto"):
    """Gradients of ``sum(dout * attention_varlen(q, k, v, ...))``.

    Parameters
    ----------
    q, k, v, cu_seqlens_q, cu_seqlens_k
        As :func:`attention_varlen`.
    dout : ndarray, shape (total_q, H, Dv)
        Gradient of the output, in q's dtype.
    out : ndarray, shape (total_q, H, Dv), optional
        The forward's output (same arguments and seed); recomputed when missing.
    lse : ndarray, shape (H, total_q), optional
        The forward's log-sum-exp (float32 for half inputs); recomputed (with ``out``)
        when missing.
    max_seqlen_q, max_seqlen_k, causal, scale, dropout_p, seed, score_mod, mask_mod, sinks,
    backend
        As :func:`attention_varlen`.

    Returns
    -------
    dq : ndarray, shape of q
    dk : ndarray, shape of k
    dv : ndarray, shape of v
        dq, dk and dv in q's dtype.
    dsinks : ndarray, shape (H,)
        Only when ``sinks`` are given, in q's dtype.
    """
    problem = prepare_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                             max_seqlen_k=max_seqlen_k, causal=causal, scale=scale,
                             dropout_p=dropout_p, seed=seed, score_mod=score_mod,
                             mask_mod=mask_mod, sinks=sinks)
    if problem.score_mod is not None:
        problem.score_mod.grad("cpu", compute_dtype(problem.dtype))
    H, _, _, Dv = problem.heads
    total_q = problem.q.shape[0]
    dout = _check_like("dout", dout, (total_q, H, Dv), problem.dtype)
    out = None if out is None else _check_like("out", out, (total_q, H, Dv), problem.dtype)
    lse = None if lse is None else _check_like("lse", lse, (H, total_q),
                                               compute_dtype(problem.dtype))
    name = resolve(check_backend(backend), problem, "varlen")
    varlen = entry_module(name, "varlen")
    if varlen is None:
        return _dense_backward(problem, name, dout, out, lse)
    if out is None or lse is None:
        out, lse = varlen.run(problem)
        if problem.sinks is not None:
            o, lse, _ = merge_sinks(out.transpose(1, 0, 2), lse, problem.sinks, 0)
            out = np.ascontiguousarray(o.transpose(1, 0, 2))
    kernel_lse = lse if problem.sinks is None else keys_only_lse(lse, problem.sinks, 0)
    grads = varlen.run_backward(problem, dout, out, kernel_lse)
    if problem.sinks is None:
        return grads
    return grads + (sink_gradient(dout.transpose(1, 0, 2), out.transpose(1, 0, 2), lse,
                                  problem.sinks, 0),)


def _check_like(name, x, shape, dtype):
    x = as_numpy(name, x, "attention_varlen_backward")
    what = ("the forward's lse: q's dtype, float32 for half inputs" if name == "lse"
            else "the dtype of q")
    require_dtype(name, x, (dtype,), f"{dtype} ({what})")
    return np.ascontiguousarray(require_shape(name, x, shape))


def _dense_backward(problem: VarlenProblem, name: str, dout, out, lse):
    """Each sequence's gradients by the dense backward of ``name`` (see :func:`_dense_call`)."""
    dq = np.zeros_like(problem.q)
    dk = np.zeros_like(problem.k)
    dv = np.zeros_like(problem.v)
    dsinks = None if problem.sinks is None else np.zeros(problem.heads[0], np.float64)
    cu_q, cu_k = problem.cu_seqlens_q, problem.cu_seqlens_k
    for b in range(problem.n_seq):
        if problem.lengths_q[b] == 0 or problem.lengths_k[b] == 0:
            continue  # no gradient flows: out = 0 (and p_sink · rowsum(dout · 0) = 0)
        q, k, v, d = _dense_inputs(problem, b, (problem.q, cu_q), (problem.k, cu_k),
                                   (problem.v, cu_k), (dout, cu_q))
        grads = attention_backward(q, k, v, d, backend=name, sinks=problem.sinks,
                                   **_dense_keywords(problem, b))
        dq[cu_q[b]:cu_q[b + 1]] = grads[0][b].transpose(1, 0, 2)
        dk[cu_k[b]:cu_k[b + 1]] = grads[1][b].transpose(1, 0, 2)
        dv[cu_k[b]:cu_k[b + 1]] = grads[2][b].transpose(1, 0, 2)
        if dsinks is not None:
            # The other entries' rows see no key: they add p_sink · rowsum(0 · 0) = 0.
            dsinks += grads[3]
    grads = (dq, dk, dv)
    return grads if dsinks is None else grads + (dsinks.astype(problem.dtype),)

