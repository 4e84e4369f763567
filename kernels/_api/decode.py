"""The decode API of :mod:`kernels`: :func:`attention_with_kvcache`, one decode step against
a KV cache (contiguous or paged), appending the new keys and values in place.

Validates everything (:mod:`kernels._problems.decode_checks`), picks the backend, writes the new
tokens into the cache, then hands the :class:`DecodeProblem` to the backend's decode module
through the one dispatch table (:mod:`kernels._api.dispatch`).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .._problems.checks import check_backend
from .._problems.decode_checks import append_to_cache, check_decode_args
from .._problems.sinks import merge_sinks
from .dispatch import entry_module, resolve

__all__ = ["attention_with_kvcache"]

def attention_with_kvcache(q, k_cache, v_cache, k=None, v=None, *, cache_seqlens,
                           block_table=None, causal=True, scale=None, score_mod=None,
                           mask_mod=None, num_splits=0, return_lse=False, sinks=None,
                           deterministic=False, backend="auto"):
    """Attention of new queries against a KV cache, appending new keys and values in place.

    As FlashAttention's ``flash_attn_with_kvcache``, in this package's ``(B, H, L, D)``
    layout.

    Parameters
    ----------
    q : ndarray, shape (B, H, Lq, D)
        The new queries: float32, float64, float16 or ``ml_dtypes.bfloat16`` (half inputs
        are computed in float32; the cache is read in its own half precision, never copied).
    k_cache, v_cache : ndarray
        Contiguous: (B, Hkv, Lmax, D) and (B, Hkv, Lmax, Dv).  Paged (with
        ``block_table``): (num_pages, Hkv, page_size, D) and (num_pages, Hkv, page_size,
        Dv).  q's dtype, C-contiguous; H must be a multiple of Hkv (GQA/MQA).
    k, v : ndarray, shape (B, Hkv, Lnew, D) and (B, Hkv, Lnew, Dv), optional
        New keys and values, written into the cache in place at positions
        ``cache_seqlens[b] .. cache_seqlens[b] + Lnew - 1`` before attending; no other
        slot or page changes.
    cache_seqlens : int or array_like of int, shape (B,)
        Tokens already in the cache per sequence (0 allowed).  Not modified: the caller
        advances it (or uses :class:`kernels.KVCache`).
    block_table : array_like of int, shape (B, pages_per_seq), optional
        Page indices of each sequence's tokens: token j of sequence b lies on page
        ``block_table[b, j // page_size]`` at slot ``j % page_size``.  The entries a
        sequence uses must lie in ``[0, num_pages)``; sequences that append must not
        share the pages they write.
    causal : bool, default True
        Query i of sequence b is at the absolute position
        ``cache_seqlens[b] + Lnew - Lq + i`` and sees keys at positions <= that.
        ``False``: every query sees all ``cache_seqlens[b] + Lnew`` keys.
    scale : float, optional
        Multiplies ``q · k``; default ``1 / sqrt(D)``.
    score_mod, mask_mod : optional
        As :func:`kernels.attention`, with ``q_idx`` the query's absolute position (so
        ``mods.sliding_window`` and ``mods.alibi`` mean what they mean in the full
        forward); data bound to them is indexed up to the cache's capacity.  Not a
        ``block_mask``.
    num_splits : int, default 0
        0 chooses (from the thread count, unless ``deterministic``); 1 never splits a
        sequence's keys; n > 1 splits them into n chunks computed in parallel and merged
        by log-sum-exp.  The result is the same from call to call for a given
        ``num_splits``.
    return_lse : bool, default False
        Also return the natural-log log-sum-exp of each query row's visible scores.
    sinks : ndarray, shape (H,), optional
        Attention sinks, one logit per query head in q's dtype, as for
        :func:`kernels.attention`: each joins its row's softmax denominator (after
        ``score_mod``) and has no value; a query that sees no key then gets 0 and
        ``lse = sinks[h]``.
    deterministic : bool, default False
        With ``num_splits=0``, split each sequence's keys into runs of a fixed
        ``kernels._problems.decode.DETERMINISTIC_SPLIT_KEYS`` (2048) keys, as SGLang's
        deterministic mode fixes FlashInfer's split size: the split boundaries depend only
        on the sequence's own length, so the bits of a sequence's rows do not depend on the
        thread count nor on the other sequences of the batch (``False``: the split count
        follows the thread count, the batch size and the longest sequence).  An explicit
        ``num_splits`` n > 0 wins: it cuts each sequence into n parts of its own length,
        already independent of both.  The cuda backend takes the same fixed split size;
        the reference does not split.
    backend : {"auto", "reference", "numba", "cuda"}, default "auto"

    Returns
    -------
    out : ndarray, shape (B, H, Lq, Dv), dtype of q
        0 for a query that sees no key.
    lse : ndarray, shape (B, H, Lq)
        Only if ``return_lse``; ``-inf`` for a query that sees no key; float32 for half
        inputs, else q's dtype.

    Raises
    ------
    TypeError, ValueError
        Bad input, before anything is written; the message names the argument (e.g. a
        ``cache_seqlens`` that would overflow the cache, a ``block_table`` entry out of
        range, a cache of the wrong dtype or shape, negative lengths).

    Examples
    --------
    >>> import numpy as np, kernels
    >>> k_cache = np.zeros((1, 2, 16, 8), np.float32)      # (B, Hkv, Lmax, D)
    >>> v_cache = np.zeros_like(k_cache)
    >>> q = np.ones((1, 4, 1, 8), np.float32)              # (B, H, Lq, D): GQA 4/2
    >>> new = np.ones((1, 2, 1, 8), np.float32)
    >>> out = kernels.attention_with_kvcache(q, k_cache, v_cache, new, new, cache_seqlens=[0])
    >>> out.shape, float(k_cache[0, 0, 0, 0]), float(k_cache[0, 0, 1, 0])
    ((1, 4, 1, 8), 1.0, 0.0)
    """
    backend = check_backend(backend)
    problem, k, v, lengths = check_decode_args(
        q, k_cache, v_cache, k, v, cache_seqlens=cache_seqlens, block_table=block_table,
        causal=causal, scale=scale, score_mod=score_mod, mask_mod=mask_mod,
        num_splits=num_splits, sinks=sinks, deterministic=deterministic)
    if not isinstance(return_lse, bool | np.bool_):
        raise TypeError(f"return_lse must be a bool; got {type(return_lse).__name__}")
    name = resolve(backend, problem, "decode")  # before anything is written
    append_to_cache(problem, k, v, lengths)
    decode = entry_module(name, "decode")
    if problem.sinks is not None and name != "reference":  # the kernel, then the sinks
        out, lse = decode.run(replace(problem, sinks=None))
        out, lse, _ = merge_sinks(out, lse, problem.sinks, 1)
    else:
        out, lse = decode.run(problem)
    return (out, lse) if return_lse else out
