"""The two multi-head forms the source articles describe: a per-head loop with
concatenation (:func:`multihead_loop`) and one big projection + reshape + batched attention
+ reshape (:func:`multihead_fused`), used to check that they agree; and the reshapes
between them (:func:`split_heads`, :func:`merge_heads`).
"""

from __future__ import annotations

import numpy as np

from ._api.dense import attention
from ._dtypes import compute_dtype

# --- the two multi-head forms -------------------------------------------------------------
#
# Parameters follow kernels.MultiHeadAttention: x @ W + b with W of shape (in, out);
# W_q: (d_model, H*d_head), W_k and W_v: (d_model, Hkv*d_head), W_o: (H*d_head, d_model).


def project(x, params, name):
    # Half precision: the product in float32 (no half arithmetic), rounded once to x's dtype.
    wide = compute_dtype(x.dtype)
    y = x.astype(wide, copy=False) @ params[f"W_{name}"].astype(wide, copy=False)
    bias = params.get(f"b_{name}")
    y = y if bias is None else y + bias.astype(wide, copy=False)
    return y.astype(x.dtype, copy=False)


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
    n_kv_heads = n_kv_heads or n_heads
    d_head = params["W_q"].shape[1] // n_heads
    group = n_heads // n_kv_heads
    q_all = project(x, params, "q")  # (..., L, H*d_head)
    k_all = project(x, params, "k")  # (..., L, Hkv*d_head)
    v_all = project(x, params, "v")  # (..., L, Hkv*d_head)
    heads = []
    for h in range(n_heads):
        g = h // group
        q_h = q_all[..., None, :, h * d_head:(h + 1) * d_head]  # (..., 1, L, d_head)
        k_h = k_all[..., None, :, g * d_head:(g + 1) * d_head]
        v_h = v_all[..., None, :, g * d_head:(g + 1) * d_head]
        head = attention(q_h, k_h, v_h, backend="reference", **attention_kwargs)
        heads.append(head[..., 0, :, :])  # (..., L, d_head)
    concat = np.concatenate(heads, axis=-1)  # (..., L, H*d_head)
    return project(concat, params, "o")


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
    n_kv_heads = n_kv_heads or n_heads
    q = split_heads(project(x, params, "q"), n_heads)  # (..., H, L, d_head)
    k = split_heads(project(x, params, "k"), n_kv_heads)  # (..., Hkv, L, d_head)
    v = split_heads(project(x, params, "v"), n_kv_heads)  # (..., Hkv, L, d_head)
    heads = attention(q, k, v, backend=backend, **attention_kwargs)  # (..., H, L, d_head)
    return project(merge_heads(heads), params, "o")
