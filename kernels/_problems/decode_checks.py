"""Argument checks of :func:`kernels.attention_with_kvcache` and the in-place append.

Everything is checked before anything is written: a call that raises leaves the cache as
it was.  :func:`check_decode_args` returns the :class:`DecodeProblem` and the new keys and
values; :func:`append_to_cache` writes them (the only write to the caller's cache).
"""

from __future__ import annotations

import numbers

import numpy as np

from .._dtypes import SUPPORTED_DTYPES, compute_dtype
from .arrays import as_numpy, require_dtype, require_integers, wrong_shape
from .checks import _check_scale, check_deterministic
from .decode import DecodeProblem
from .sinks import check_sinks


def _float_array(name: str, x, dtype=None) -> np.ndarray:
    x = as_numpy(name, x, "attention_with_kvcache")
    require_dtype(name, x, SUPPORTED_DTYPES, "float32, float64, float16 or bfloat16 (ml_dtypes)")
    if dtype is not None:
        require_dtype(name, x, (dtype,), f"{dtype}, the dtype of q")
    return x


def _int_array(name: str, x) -> np.ndarray:
    return require_integers(name, x).astype(np.int64)


def _check_cache(name: str, cache, dtype, lead: tuple, last: int | None, what: str):
    cache = _float_array(name, cache, dtype)
    if cache.ndim != 4 or cache.shape[:3] != lead or (last is not None and cache.shape[3] != last):
        raise wrong_shape(name, cache.shape, f"{what}")
    if not cache.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (the kernels read and write it in "
                         "place); got a strided view")
    return cache


def _check_block_table(block_table, B: int, num_pages: int):
    table = _int_array("block_table", block_table)
    if table.ndim != 2 or table.shape[0] != B or table.shape[1] < 1:
        raise wrong_shape("block_table", table.shape, f"(B={B}, pages_per_seq) "
                          "with pages_per_seq >= 1")
    return np.ascontiguousarray(table)


def _check_new(name: str, x, dtype, expected: tuple):
    x = _float_array(name, x, dtype)
    if x.shape[:2] != expected[:2] or x.ndim != 4 or x.shape[3] != expected[3]:
        raise wrong_shape(name, x.shape, f"(B, Hkv, Lnew, last) = "
                          f"{expected[:2] + ('Lnew',) + expected[3:]}")
    return x


def check_decode_args(q, k_cache, v_cache, k=None, v=None, *, cache_seqlens, block_table=None,
                      causal=True, scale=None, score_mod=None, mask_mod=None, num_splits=0,
                      sinks=None, deterministic=False):
    """Validate every argument; return ``(problem, k_new, v_new, cache_seqlens)``.

    ``problem.seqlens`` already counts the new tokens (``cache_seqlens + Lnew``); nothing is
    written here.
    """
    q = _float_array("q", q)
    if q.ndim != 4:
        raise ValueError(f"q must have shape (B, H, Lq, D); got {q.shape}")
    B, H, Lq, D = q.shape
    dtype = q.dtype
    if block_table is None:
        k_cache = _float_array("k_cache", k_cache, dtype)
        if k_cache.ndim != 4 or k_cache.shape[0] != B or k_cache.shape[3] != D:
            raise wrong_shape("k_cache", k_cache.shape, f"(B={B}, Hkv, Lmax, "
                              f"D={D}) (or a paged cache with block_table)")
        _, Hkv, Lmax, _ = k_cache.shape
        k_cache = _check_cache("k_cache", k_cache, dtype, (B, Hkv, Lmax), D,
                               f"(B={B}, Hkv, Lmax, D={D})")
        v_cache = _check_cache("v_cache", v_cache, dtype, (B, Hkv, Lmax), None,
                               f"(B={B}, Hkv={Hkv}, Lmax={Lmax}, Dv), as k_cache")
        table = np.arange(B, dtype=np.int64).reshape(B, 1)  # sequence b on page b
        capacity = Lmax
    else:
        k_cache = _float_array("k_cache", k_cache, dtype)
        if k_cache.ndim != 4 or k_cache.shape[3] != D or k_cache.shape[2] < 1:
            raise wrong_shape("k_cache", k_cache.shape, f"(num_pages, Hkv, "
                              f"page_size, D={D}) for a paged cache")
        num_pages, Hkv, page_size, _ = k_cache.shape
        k_cache = _check_cache("k_cache", k_cache, dtype, (num_pages, Hkv, page_size), D,
                               f"(num_pages, Hkv, page_size, D={D})")
        v_cache = _check_cache("v_cache", v_cache, dtype, (num_pages, Hkv, page_size), None,
                               f"(num_pages={num_pages}, Hkv={Hkv}, page_size={page_size}, Dv), "
                               "as k_cache")
        table = _check_block_table(block_table, B, num_pages)
        capacity = table.shape[1] * page_size
    if Hkv < 1 or H % Hkv:
        raise ValueError(f"the number of query heads ({H}, q {q.shape}) must be a multiple of "
                         f"the number of key/value heads ({Hkv}, k_cache {k_cache.shape})")
    Dv = v_cache.shape[3]

    if (k is None) != (v is None):
        raise ValueError("k and v go together: pass both new keys and values, or neither")
    Lnew = 0
    if k is not None:
        k = _check_new("k", k, dtype, (B, Hkv, None, D))
        v = _check_new("v", v, dtype, (B, Hkv, None, Dv))
        if k.shape[2] != v.shape[2]:
            raise ValueError(f"k and v must hold the same number of new tokens; got k {k.shape},"
                             f" v {v.shape}")
        Lnew = k.shape[2]

    lengths = _int_array("cache_seqlens", cache_seqlens)
    if lengths.ndim == 0:
        lengths = np.full(B, int(lengths), np.int64)
    if lengths.shape != (B,):
        raise wrong_shape("cache_seqlens", lengths.shape, f"(B={B},) or a scalar")
    if lengths.size and lengths.min() < 0:
        raise ValueError(f"cache_seqlens must be >= 0; got {lengths.min()}")
    seqlens = lengths + Lnew
    if seqlens.size and seqlens.max() > capacity:
        b = int(np.argmax(seqlens))
        raise ValueError(
            f"cache_seqlens[{b}] = {lengths[b]} plus {Lnew} new tokens exceeds the cache's "
            f"capacity of {capacity} tokens per sequence"
            + ("" if block_table is None else
               f" (block_table: {table.shape[1]} pages of {k_cache.shape[2]})"))
    if block_table is not None:
        used = np.arange(table.shape[1])[None, :] * k_cache.shape[2] < seqlens[:, None]
        bad = used & ((table < 0) | (table >= k_cache.shape[0]))
        if bad.any():
            b, p = (int(x) for x in np.argwhere(bad)[0])
            raise ValueError(f"block_table[{b}, {p}] = {table[b, p]} is out of range: the paged "
                             f"cache has {k_cache.shape[0]} pages")

    if isinstance(causal, np.bool_):
        causal = bool(causal)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool; got {causal!r}")
    if isinstance(num_splits, bool) or not isinstance(num_splits, numbers.Integral):
        raise TypeError(f"num_splits must be an int; got {type(num_splits).__name__}")
    if num_splits < 0:
        raise ValueError(f"num_splits must be >= 0 (0 chooses); got {num_splits}")
    deterministic = check_deterministic(deterministic)
    score, mask = _check_mods(score_mod, mask_mod, B, H, capacity, dtype)
    if (score is not None or mask is not None) and seqlens.size and (seqlens < Lq).any():
        b = int(np.argmin(seqlens - Lq))
        raise ValueError(
            f"cache_seqlens[{b}] = {lengths[b]} plus {Lnew} new tokens is fewer than Lq={Lq}: "
            "queries would have negative positions, which score_mod and mask_mod cannot take")
    problem = DecodeProblem(
        q=np.ascontiguousarray(q), k_cache=k_cache, v_cache=v_cache, block_table=table,
        seqlens=seqlens, causal=causal, scale=_check_scale(scale, D), num_splits=int(num_splits),
        score_mod=score, mask_mod=mask, paged=block_table is not None,
        sinks=check_sinks(sinks, H, dtype), deterministic=deterministic)
    return problem, k, v, lengths


def _check_mods(score_mod, mask_mod, B, H, capacity, dtype):
    if score_mod is None and mask_mod is None:
        return None, None
    from .. import mods

    score = None if score_mod is None else mods.as_score_mod(score_mod)
    mask = None if mask_mod is None else mods.as_mask_mod(mask_mod)
    if mask is not None and mask.formula is not None and mask.formula[0] == "block_mask":
        raise ValueError("mask_mod is a block_mask, classified for one (Lq, Lk); decoding "
                         "moves the queries: pass the mask function itself")
    for mod in (score, mask):
        if mod is not None:
            mod.check(B, H, capacity, capacity)  # positions run over the cache's capacity
    if score is not None:
        score.element("cpu", compute_dtype(dtype))
    return score, mask


def append_to_cache(problem: DecodeProblem, k, v, cache_seqlens: np.ndarray) -> None:
    """Write new keys and values (B, Hkv, Lnew, D) into the cache at positions
    ``cache_seqlens[b] .. cache_seqlens[b] + Lnew - 1``; nothing else changes."""
    if k is None or k.shape[2] == 0:
        return
    ps = problem.page_size
    for b in range(k.shape[0]):
        positions = cache_seqlens[b] + np.arange(k.shape[2])  # (Lnew,)
        pages = problem.block_table[b, positions // ps]
        slots = positions % ps
        problem.k_cache[pages, :, slots] = k[b].transpose(1, 0, 2)  # (Lnew, Hkv, D)
        problem.v_cache[pages, :, slots] = v[b].transpose(1, 0, 2)
