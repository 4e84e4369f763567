"""``KVCache``: the keys and values of B sequences, contiguous or paged, with their lengths;
what :func:`kernels.attention_with_kvcache` and ``MultiHeadAttention.forward(x_new,
cache=cache)`` decode against."""

from __future__ import annotations

import numbers

import numpy as np

from ._api.decode import attention_with_kvcache
from ._dtypes import SUPPORTED_DTYPES, as_dtype
from ._problems.arrays import wrong_shape

__all__ = ["KVCache"]


def _count(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}; got {value!r}")
    return int(value)


class KVCache:
    """Keys and values of ``batch`` sequences, up to ``max_len`` tokens each.

    Parameters
    ----------
    batch, n_kv_heads, max_len, head_dim : int
        Sequences, key/value heads, capacity per sequence (tokens), key size D.
    value_dim : int, optional
        Value size Dv; default ``head_dim``.
    dtype : dtype, default float32
        float32, float64, float16 or ``ml_dtypes.bfloat16`` (or ``"bfloat16"``): the
        queries decoded against it have the same dtype.
    page_size : int, optional
        Store the cache in pages of ``page_size`` tokens: ``k`` is then (num_pages,
        n_kv_heads, page_size, D) and ``block_table`` (batch, pages_per_seq) gives each
        sequence's pages (in order here; any order works for
        :func:`kernels.attention_with_kvcache`).

    Attributes
    ----------
    k, v : ndarray
        Contiguous: (batch, n_kv_heads, max_len, D) and (..., Dv); paged: (num_pages,
        n_kv_heads, page_size, D) and (..., Dv).  Zeros until written.
    seqlens : ndarray of int64, shape (batch,)
        Tokens stored per sequence.
    block_table : ndarray of int64, shape (batch, pages_per_seq), or None
        None when contiguous.
    max_len : int
        Capacity per sequence.
    """

    def __init__(self, batch, n_kv_heads, max_len, head_dim, *, value_dim=None,
                 dtype=np.float32, page_size=None):
        batch, n_kv_heads = _count("batch", batch), _count("n_kv_heads", n_kv_heads)
        self.max_len, head_dim = _count("max_len", max_len), _count("head_dim", head_dim)
        value_dim = head_dim if value_dim is None else _count("value_dim", value_dim)
        self.dtype = as_dtype(dtype)
        if self.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"dtype must be float32, float64, float16 or bfloat16; got "
                            f"{self.dtype}")
        if page_size is None:
            slots = (batch, n_kv_heads, self.max_len)
            self.block_table = None
        else:
            page_size = _count("page_size", page_size)
            per_seq = -(-self.max_len // page_size)
            slots = (batch * per_seq, n_kv_heads, page_size)
            self.block_table = np.arange(batch * per_seq, dtype=np.int64).reshape(batch, per_seq)
        self.k = np.zeros(slots + (head_dim,), dtype=self.dtype)
        self.v = np.zeros(slots + (value_dim,), dtype=self.dtype)
        self.seqlens = np.zeros(batch, dtype=np.int64)

    def __repr__(self) -> str:
        kind = "contiguous" if self.block_table is None else f"paged({self.k.shape[2]})"
        return (f"KVCache(batch={self.seqlens.size}, n_kv_heads={self.k.shape[1]}, "
                f"max_len={self.max_len}, {kind}, seqlens={self.seqlens.tolist()})")

    def _check_room(self, Lnew: int) -> None:
        if self.seqlens.size and int(self.seqlens.max()) + Lnew > self.max_len:
            b = int(np.argmax(self.seqlens))
            raise ValueError(f"seqlens[{b}] = {self.seqlens[b]} plus {Lnew} new tokens exceeds "
                             f"the cache's max_len of {self.max_len}")

    def append(self, k, v) -> None:
        """Write new keys and values after each sequence's tokens and advance ``seqlens``.

        Parameters
        ----------
        k : ndarray, shape (batch, n_kv_heads, Lnew, D)
        v : ndarray, shape (batch, n_kv_heads, Lnew, Dv)

        Returns
        -------
        None
        """
        k, v = np.asarray(k), np.asarray(v)
        B, Hkv = self.seqlens.size, self.k.shape[1]
        for name, x, last in (("k", k, self.k.shape[3]), ("v", v, self.v.shape[3])):
            if x.dtype != self.dtype:
                raise TypeError(f"{name} has dtype {x.dtype}; the cache holds {self.dtype}")
            if x.ndim != 4 or x.shape[:2] != (B, Hkv) or x.shape[3] != last:
                raise wrong_shape(name, x.shape, f"({B}, {Hkv}, Lnew, "
                                  f"{last})")
        if k.shape[2] != v.shape[2]:
            raise ValueError(f"k and v hold different numbers of tokens: {k.shape}, {v.shape}")
        Lnew = k.shape[2]
        self._check_room(Lnew)
        ps = self.k.shape[2]
        for b in range(B):
            positions = self.seqlens[b] + np.arange(Lnew)
            pages = (np.full(Lnew, b) if self.block_table is None
                     else self.block_table[b, positions // ps])
            self.k[pages, :, positions % ps] = k[b].transpose(1, 0, 2)  # (Lnew, Hkv, D)
            self.v[pages, :, positions % ps] = v[b].transpose(1, 0, 2)
        self.seqlens += Lnew

    def attend(self, q, k=None, v=None, **keywords):
        """Append ``k``, ``v`` (if given), attend ``q`` to every sequence's tokens, advance.

        Parameters
        ----------
        q : ndarray, shape (batch, H, Lq, D)
        k, v : ndarray, shape (batch, n_kv_heads, Lnew, D) and (..., Dv), optional
        **keywords
            Those of :func:`kernels.attention_with_kvcache` (``causal``, ``scale``,
            ``score_mod``, ``mask_mod``, ``num_splits``, ``return_lse``, ``sinks``,
            ``deterministic``, ``backend``).

        Returns
        -------
        ndarray or tuple
            What :func:`kernels.attention_with_kvcache` returns.
        """
        Lnew = 0 if k is None else np.shape(k)[2]
        self._check_room(Lnew)
        result = attention_with_kvcache(q, self.k, self.v, k, v, cache_seqlens=self.seqlens,
                                        block_table=self.block_table, **keywords)
        self.seqlens += Lnew
        return result
