"""The reference backend: the literal attention formula in NumPy, accumulated in float64.

This is the oracle every fast path is compared with.  It is written to be read,
not to be fast: it materialises the full (B, H, Lq, Lk) score matrix

    out = softmax(Q Kᵀ · scale + M) V

with M the additive mask (-inf where a key is hidden by ``causal``, ``mask`` or
``key_lengths``).  It also holds the two multi-head forms the source articles
describe (a per-head loop with concatenation, and one big projection + reshape +
batched attention + reshape), used to check that they agree.
"""

from __future__ import annotations

import numpy as np

from . import reference_mods
from ._dropout import keep_mask
from ._validate import AttentionProblem


def _softmax_visible(scores: np.ndarray, visible: np.ndarray) -> np.ndarray:
    """Row softmax over the visible entries; rows with no visible entry are all 0."""
    scores = np.where(visible, scores, -np.inf)
    any_visible = visible.any(axis=-1, keepdims=True)
    zero = scores.dtype.type(0)
    row_max = np.where(any_visible, scores.max(axis=-1, keepdims=True, initial=-np.inf), zero)
    exp = np.where(visible, np.exp(scores - row_max), zero)
    denom = exp.sum(axis=-1, keepdims=True)
    return np.divide(exp, denom, out=np.zeros_like(exp), where=denom != 0)  # NaN stays NaN


def _weighted_values(probs: np.ndarray, visible: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``probs @ v`` that never reads a value at a hidden position.

    A plain matmul would turn a NaN/inf stored in a hidden value into NaN
    (0 · NaN = NaN); if any value is non-finite, rows are summed over their
    visible keys only.
    """
    if np.isfinite(v).all():
        return probs @ v
    out = np.zeros(probs.shape[:-1] + v.shape[-1:], dtype=probs.dtype)
    for idx in np.ndindex(*probs.shape[:-1]):  # (b, h, i)
        keys = visible[idx]
        out[idx] = probs[idx][keys] @ v[idx[:-1]][keys]
    return out


def _logsumexp_visible(scores: np.ndarray, visible: np.ndarray) -> np.ndarray:
    """``log Σ_j exp(scores)`` over the visible entries of each row; ``-inf`` if none."""
    scores = np.where(visible, scores, -np.inf)
    row_max = scores.max(axis=-1, keepdims=True, initial=-np.inf)
    shift = np.where(np.isfinite(row_max), row_max, scores.dtype.type(0))
    with np.errstate(divide="ignore"):
        total = np.log(np.where(visible, np.exp(scores - shift), 0).sum(axis=-1))
    return total + shift[..., 0]


def run(problem: AttentionProblem, compute_dtype=np.float64, keep_precision=False,
        return_lse=False, scores_from=None):
    """Attention for a validated problem; returns ``(out, weights or None)``.

    With ``return_lse``, ``(out, weights or None, lse)``: lse (B, H, Lq) is the log-sum-exp
    of each row's visible scores (``-inf`` for a row that sees no key).

    Parameters
    ----------
    problem : AttentionProblem
    compute_dtype : dtype, default float64
        The precision the formula is evaluated in. The tests also evaluate it in the
        input dtype (a plain implementation's own error is the tolerance baseline) and
        in ``np.longdouble`` (the oracle for float64 inputs).
    keep_precision : bool, default False
        Return results in ``compute_dtype`` instead of rounding them to the input dtype.
    scores_from : dtype, optional
        Compute the scaled scores ``Q Kᵀ · scale`` in this wider dtype and round them to
        ``compute_dtype``: the formula as an implementation whose dot products are
        correctly rounded evaluates it (the second tolerance baseline,
        :func:`attnbench.measure.oracle.oracle`).
    """
    B, H, Hkv, Lq, Lk, D, Dv = problem.shape
    group = H // Hkv
    ct = np.dtype(compute_dtype).type
    q = problem.q.astype(ct)  # (B, H, Lq, D)
    k = np.repeat(problem.k.astype(ct), group, axis=1)  # (B, H, Lk, D)
    v = np.repeat(problem.v.astype(ct), group, axis=1)  # (B, H, Lk, Dv)

    # Hidden keys may hold garbage (inf, NaN): their scores are computed by the matmul but
    # replaced by -inf before the softmax, so the warnings they raise are noise.
    with np.errstate(invalid="ignore", over="ignore"):
        if scores_from is None:
            scores = (q @ k.swapaxes(-1, -2)) * ct(problem.scale)  # (B, H, Lq, Lk)
        else:
            wide = np.dtype(scores_from).type
            k_wide = np.repeat(problem.k.astype(wide), group, axis=1)
            scores = ((problem.q.astype(wide) @ k_wide.swapaxes(-1, -2))
                      * wide(problem.scale)).astype(ct)
        if problem.score_mod is not None:  # on the scaled scores, before the mask
            scores = reference_mods.scores(problem.score_mod, scores, ct)
        if problem.mask is not None:
            scores = scores + problem.additive_mask().astype(ct)
    visible = problem.visible(reference_mods.visible)  # (B, H, Lq, Lk)
    weights = _softmax_visible(scores, visible)  # (B, H, Lq, Lk)

    probs = weights
    if problem.dropout_p > 0:
        keep = keep_mask(problem.seed, problem.dropout_p, (B, H, Lq, Lk))
        probs = weights * keep / ct(1.0 - problem.dropout_p)
    out = _weighted_values(probs, visible, v)  # (B, H, Lq, Dv)

    dtype = ct if keep_precision else problem.dtype
    result = out.astype(dtype), (weights.astype(dtype) if problem.return_weights else None)
    if return_lse:
        return result + (_logsumexp_visible(scores, visible).astype(dtype),)
    return result


# --- the two multi-head forms -------------------------------------------------------------
#
# Parameters follow kernels.MultiHeadAttention: x @ W + b with W of shape (in, out);
# W_q: (d_model, H*d_head), W_k and W_v: (d_model, Hkv*d_head), W_o: (H*d_head, d_model).


def _project(x, params, name):
    y = x @ params[f"W_{name}"]
    bias = params.get(f"b_{name}")
    return y if bias is None else y + bias


def multihead_loop(x, params, n_heads, n_kv_heads=None, **attention_kwargs):
    """Multi-head attention as the articles first write it: one head at a time, then concat.

    For head h: Q_h = x W_Q[:, h], K_h = x W_K[:, g], V_h = x W_V[:, g] with g the head's
    key/value group; head_h = softmax(Q_h K_hᵀ / √d_head) V_h; out = concat_h(head_h) W_O.

    Parameters
    ----------
    x : ndarray, shape (..., L, d_model)
    params : dict of ndarray
        ``W_q, W_k, W_v, W_o`` and optionally ``b_q, b_k, b_v, b_o``.
    n_heads, n_kv_heads : int
        Query heads and key/value heads (``None``: same as ``n_heads``).
    **attention_kwargs
        Passed to the reference attention (``causal``, ``mask``, ``key_lengths``...);
        a ``mask`` must not have a head dimension other than 1.
    """
    from . import attention

    n_kv_heads = n_kv_heads or n_heads
    d_head = params["W_q"].shape[1] // n_heads
    group = n_heads // n_kv_heads
    q_all = _project(x, params, "q")  # (..., L, H*d_head)
    k_all = _project(x, params, "k")  # (..., L, Hkv*d_head)
    v_all = _project(x, params, "v")  # (..., L, Hkv*d_head)
    heads = []
    for h in range(n_heads):
        g = h // group
        q_h = q_all[..., None, :, h * d_head:(h + 1) * d_head]  # (..., 1, L, d_head)
        k_h = k_all[..., None, :, g * d_head:(g + 1) * d_head]
        v_h = v_all[..., None, :, g * d_head:(g + 1) * d_head]
        head = attention(q_h, k_h, v_h, backend="reference", **attention_kwargs)
        heads.append(head[..., 0, :, :])  # (..., L, d_head)
    concat = np.concatenate(heads, axis=-1)  # (..., L, H*d_head)
    return _project(concat, params, "o")


def split_heads(x, n_heads):
    """(..., L, n_heads*d_head) -> (..., n_heads, L, d_head): a reshape and a transpose."""
    *lead, L, width = x.shape
    return np.swapaxes(x.reshape(*lead, L, n_heads, width // n_heads), -2, -3)


def merge_heads(x):
    """(..., H, L, d_head) -> (..., L, H*d_head): the "concat" of heads, a transpose + reshape."""
    *lead, H, L, d_head = x.shape
    return np.swapaxes(x, -2, -3).reshape(*lead, L, H * d_head)


def multihead_fused(x, params, n_heads, n_kv_heads=None, backend="reference", **attention_kwargs):
    """Multi-head attention as one big projection + reshape + batched attention + reshape.

    Same parameters as :func:`multihead_loop`; ``backend`` picks the attention kernel.
    """
    from . import attention

    n_kv_heads = n_kv_heads or n_heads
    q = split_heads(_project(x, params, "q"), n_heads)  # (..., H, L, d_head)
    k = split_heads(_project(x, params, "k"), n_kv_heads)  # (..., Hkv, L, d_head)
    v = split_heads(_project(x, params, "v"), n_kv_heads)  # (..., Hkv, L, d_head)
    heads = attention(q, k, v, backend=backend, **attention_kwargs)  # (..., H, L, d_head)
    return _project(merge_heads(heads), params, "o")
