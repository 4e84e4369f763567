"""``MultiHeadAttention``: the projections around attention, with real, countable parameters."""

from __future__ import annotations

import numbers

import numpy as np

from . import multihead
from ._api.dense import attention, attention_backward
from ._api.varlen import attention_varlen, attention_varlen_backward
from ._dtypes import SUPPORTED_DTYPES, as_dtype, compute_dtype
from ._problems.checks import check_deterministic


def _positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive int; got {value!r}")
    return int(value)


class MultiHeadAttention:
    """Multi-head attention with W_Q, W_K, W_V, W_O (and biases), GQA/MQA via ``n_kv_heads``.

    ``forward(x)`` computes ``split_heads(x W_Q + b_Q)`` etc., batched attention over
    (..., H, L, d_head), merges the heads back (a reshape) and applies ``W_O``:
    the "one big projection + reshape" form of :func:`kernels.multihead.multihead_fused`.

    Parameters
    ----------
    d_model : int
        Width of the model; must be divisible by ``n_heads`` (``d_head = d_model // n_heads``).
    n_heads : int
        Query heads.
    n_kv_heads : int, optional
        Key/value heads (GQA; 1 is MQA). Must divide ``n_heads``. Default: ``n_heads``.
    bias : bool, default True
        Give each projection a bias vector.
    dtype : numpy dtype, default float32
        float32, float64, float16 or ``ml_dtypes.bfloat16`` (also ``"bfloat16"``): the
        parameters' dtype, and the dtype ``forward`` expects.  Half layers project in
        float32 and round each projection to the half dtype.
    seed : int, default 0
        Seed of the generator the weights are drawn from (Xavier-uniform, as PyTorch's
        ``nn.MultiheadAttention``; biases start at 0, as there).
    sinks : bool, default False
        Learn an attention sink per query head (``parameters()["sinks"]``, shape
        (n_heads,), starting at 0): see ``sinks=`` of :func:`kernels.attention`.

    Notes
    -----
    Weights are stored for ``x @ W``: ``W_q`` is (d_model, d_model), ``W_k`` and ``W_v`` are
    (d_model, n_kv_heads · d_head), ``W_o`` is (d_model, d_model).
    """

    def __init__(self, d_model, n_heads, n_kv_heads=None, bias=True, dtype=np.float32, seed=0,
                 sinks=False):
        self.d_model = _positive_int("d_model", d_model)
        self.n_heads = _positive_int("n_heads", n_heads)
        self.n_kv_heads = _positive_int("n_kv_heads", n_heads if n_kv_heads is None else n_kv_heads)
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={n_heads} must be a multiple of n_kv_heads={n_kv_heads}")
        self.dtype = as_dtype(dtype)
        if self.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"dtype must be float32, float64, float16 or bfloat16; "
                            f"got {self.dtype}")
        self.bias = bool(bias)
        self.d_head = self.d_model // self.n_heads
        rng = np.random.default_rng(seed)
        kv_width = self.n_kv_heads * self.d_head
        shapes = {
            "q": (self.d_model, self.d_model),
            "k": (self.d_model, kv_width),
            "v": (self.d_model, kv_width),
            "o": (self.d_model, self.d_model),
        }
        self._params = {}
        for name, (fan_in, fan_out) in shapes.items():
            limit = np.sqrt(6.0 / (fan_in + fan_out))
            self._params[f"W_{name}"] = rng.uniform(-limit, limit, (fan_in, fan_out)).astype(
                self.dtype
            )
            if self.bias:
                self._params[f"b_{name}"] = np.zeros(fan_out, dtype=self.dtype)
        if sinks:
            self._params["sinks"] = np.zeros(self.n_heads, dtype=self.dtype)

    def parameters(self) -> dict[str, np.ndarray]:
        """The parameter arrays themselves (not copies), by name: W_q, b_q, W_k, ..."""
        return dict(self._params)

    def num_parameters(self) -> int:
        """Number of scalars in :meth:`parameters`, counted from the arrays."""
        return int(sum(p.size for p in self._params.values()))

    def forward(self, x, *, causal=None, mask=None, key_lengths=None, score_mod=None,
                mask_mod=None, backend="auto", cache=None, cu_seqlens=None,
                deterministic=False):
        """Self-attention of ``x``; with ``cache``, one decode step against a KV cache.

        Parameters
        ----------
        x : ndarray, shape (..., L, d_model), or (total, d_model) with ``cu_seqlens``
            In the module's dtype; with ``cache``, the new tokens (B, Lnew, d_model).
        causal, mask, key_lengths, score_mod, mask_mod, backend
            As in :func:`kernels.attention`; ``mask`` broadcasts to (..., n_heads, L, L);
            a score or mask function sees the query head ``h`` and the positions in x
            (with ``cache``, the absolute positions in the sequence).  ``causal``
            defaults to False, and to True with ``cache``.
        cache : kernels.KVCache, optional
            The keys and values of earlier tokens: ``x``'s keys and values are appended
            to it, the new queries attend to every cached token (as
            :func:`kernels.attention_with_kvcache`) and the cache advances.  Not with
            ``mask``, ``key_lengths``, ``cu_seqlens`` or a module with sinks.
        cu_seqlens : array_like of int, shape (B + 1,), optional
            ``x`` is a packed batch of sequences (:func:`kernels.attention_varlen`):
            sequence b is rows ``cu_seqlens[b]:cu_seqlens[b + 1]``; no ``mask`` or
            ``key_lengths`` then.
        deterministic : bool, default False
            With ``cache``, as :func:`kernels.attention_with_kvcache`'s (a split size
            fixed by the problem, not the thread count).  Without, the forward's bits do
            not depend on the thread count anyway: checked, then ignored.

        Returns
        -------
        ndarray, shape (..., L, d_model)
        """
        deterministic = check_deterministic(deterministic)
        x = np.asarray(x)
        if x.dtype != self.dtype:
            raise TypeError(
                f"x has dtype {x.dtype} but this MultiHeadAttention holds {self.dtype} "
                f"parameters; pass x.astype(np.{self.dtype.name})"
            )
        if x.ndim < 2 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape (..., L, d_model={self.d_model}); got {x.shape}")
        sinks = self._params.get("sinks")
        if cache is not None:
            if mask is not None or key_lengths is not None or cu_seqlens is not None:
                raise ValueError("mask, key_lengths and cu_seqlens do not go with cache (the "
                                 "cache's seqlens say which keys exist)")
            return self._decode_step(x, cache, causal=True if causal is None else causal,
                                     score_mod=score_mod, mask_mod=mask_mod, backend=backend,
                                     sinks=sinks, deterministic=deterministic)
        causal = False if causal is None else causal
        if cu_seqlens is not None:
            q, k, v = self._packed_heads(x, mask, key_lengths)
            heads = attention_varlen(q, k, v, cu_seqlens, cu_seqlens, causal=causal,
                                     score_mod=score_mod, mask_mod=mask_mod, sinks=sinks,
                                     backend=backend)  # (total, H, d_head)
            return multihead.project(heads.reshape(x.shape), self._params, "o")
        return multihead.multihead_fused(
            x, self._params, self.n_heads, self.n_kv_heads, backend=backend,
            causal=causal, mask=mask, key_lengths=key_lengths, score_mod=score_mod,
            mask_mod=mask_mod, **({} if sinks is None else {"sinks": sinks}),
        )

    def _packed_heads(self, x, mask, key_lengths):
        """q (total, H, d_head), k and v (total, Hkv, d_head) of a packed x (total, d_model)."""
        if x.ndim != 2:
            raise ValueError(f"x with cu_seqlens must have shape (total, d_model); got {x.shape}")
        if mask is not None or key_lengths is not None:
            raise ValueError("mask and key_lengths do not apply to packed x (cu_seqlens)")
        total = x.shape[0]
        return tuple(multihead.project(x, self._params, name).reshape(total, heads, self.d_head)
                     for name, heads in (("q", self.n_heads), ("k", self.n_kv_heads),
                                         ("v", self.n_kv_heads)))

    __call__ = forward

    def _decode_step(self, x, cache, **keywords):
        """forward(x, cache=cache): project the new tokens, append, attend, advance."""
        if x.ndim != 3:
            raise ValueError(f"with cache, x must have shape (B, Lnew, d_model); got {x.shape}")
        if (cache.k.shape[1], cache.k.shape[3], cache.dtype) != (
                self.n_kv_heads, self.d_head, self.dtype):
            raise ValueError(f"cache holds {cache.k.shape[1]} heads of {cache.k.shape[3]} in "
                             f"{cache.dtype}; this layer needs {self.n_kv_heads} of "
                             f"{self.d_head} in {self.dtype}")
        p, split = self._params, multihead.split_heads
        q = split(multihead.project(x, p, "q"), self.n_heads)  # (B, H, Lnew, d_head)
        k = split(multihead.project(x, p, "k"), self.n_kv_heads)  # (B, Hkv, Lnew, d_head)
        v = split(multihead.project(x, p, "v"), self.n_kv_heads)
        heads = cache.attend(q, k, v, **keywords)  # (B, H, Lnew, d_head)
        return multihead.project(multihead.merge_heads(heads), p, "o")

    def backward(self, x, dy, *, causal=False, mask=None, key_lengths=None, score_mod=None,
                 mask_mod=None, backend="auto", cu_seqlens=None, deterministic=False):
        """Gradients of ``sum(dy * forward(x, ...))`` with respect to x and every parameter.

        Recomputes the forward (projections, then attention with its log-sum-exp) and runs
        :func:`kernels.attention_backward`, so a plain-NumPy training step is
        ``dx, grads = layer.backward(x, dy)`` then ``p -= lr * grads[name]`` for each
        ``name, p in layer.parameters().items()`` (the arrays are updated in place).

        Parameters
        ----------
        x : ndarray, shape (..., L, d_model)
            The input ``forward`` was called with, in the module's dtype.
        dy : ndarray, shape (..., L, d_model)
            Gradient of the loss with respect to ``forward(x)``.
        causal, mask, key_lengths, score_mod, mask_mod, backend, cu_seqlens
            The keywords ``forward`` was called with (a score function needs its
            derivative, as in :func:`kernels.attention_backward`).
        deterministic : bool, default False
            As :func:`kernels.attention_backward`'s: gradients whose bits do not depend on
            the thread count.  With ``cu_seqlens`` the packed backward is so already:
            checked, then ignored.

        Returns
        -------
        dx : ndarray, shape of x
        grads : dict of str to ndarray
            Keyed like :meth:`parameters`, each the shape of its parameter.
        """
        dy = np.asarray(dy)
        x = np.asarray(x)
        if x.dtype != self.dtype or dy.dtype != self.dtype:
            raise TypeError(
                f"x and dy must have this MultiHeadAttention's dtype {self.dtype}; got x "
                f"{x.dtype} and dy {dy.dtype}"
            )
        if x.ndim < 2 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape (..., L, d_model={self.d_model}); got {x.shape}")
        if dy.shape != x.shape:
            raise ValueError(f"dy must have the shape of forward(x), {x.shape}; got {dy.shape}")
        deterministic = check_deterministic(deterministic)
        params = self._params
        H, Hkv = self.n_heads, self.n_kv_heads
        keywords = dict(causal=causal, score_mod=score_mod, mask_mod=mask_mod, backend=backend)
        if params.get("sinks") is not None:
            keywords["sinks"] = params["sinks"]
        wide = compute_dtype(x.dtype)  # half: every product in float32, rounded once

        def product(a, b):
            return a.astype(wide, copy=False) @ b.astype(wide, copy=False)

        if cu_seqlens is not None:  # packed: heads (total, H, d_head), no reshapes
            q, k, v = self._packed_heads(x, mask, key_lengths)
            heads, lse = attention_varlen(q, k, v, cu_seqlens, cu_seqlens, return_lse=True,
                                          **keywords)
            concat = heads.reshape(x.shape)
            d_heads = product(dy, params["W_o"].T).astype(x.dtype).reshape(heads.shape)
            dqkv = attention_varlen_backward(q, k, v, d_heads, cu_seqlens, cu_seqlens,
                                             out=heads, lse=lse, **keywords)
            merge = lambda d: d.reshape(d.shape[0], -1)  # noqa: E731 (total, width)
        else:
            keywords.update(mask=mask, key_lengths=key_lengths)
            q = multihead.split_heads(multihead.project(x, params, "q"), H)  # (..., H, L, d_head)
            k = multihead.split_heads(multihead.project(x, params, "k"), Hkv)
            v = multihead.split_heads(multihead.project(x, params, "v"), Hkv)
            heads, lse = attention(q, k, v, return_lse=True, **keywords)  # (..., H, L, d_head)
            concat = multihead.merge_heads(heads)  # (..., L, H*d_head)
            d_heads = multihead.split_heads(product(dy, params["W_o"].T).astype(x.dtype), H)
            dqkv = attention_backward(q, k, v, d_heads, out=heads, lse=lse,
                                      deterministic=deterministic, **keywords)
            merge = multihead.merge_heads

        rows = x.reshape(-1, self.d_model)  # (N, d_model), N = all tokens
        d_rows = dy.reshape(-1, self.d_model)
        grads = {"W_o": product(concat.reshape(-1, concat.shape[-1]).T, d_rows)}
        if len(dqkv) == 4:
            grads["sinks"] = dqkv[3]
        dx = np.zeros(x.shape, dtype=wide)
        for name, d_proj in zip(("q", "k", "v"), dqkv[:3], strict=True):
            d_lin = merge(d_proj)  # (..., L, width)
            d_lin_rows = d_lin.reshape(-1, d_lin.shape[-1])
            grads[f"W_{name}"] = product(rows.T, d_lin_rows)
            if self.bias:
                grads[f"b_{name}"] = d_lin_rows.astype(wide).sum(axis=0)
            dx += product(d_lin, params[f"W_{name}"].T)
        if self.bias:
            grads["b_o"] = d_rows.astype(wide).sum(axis=0)
        return dx.astype(x.dtype), {name: grads[name].astype(x.dtype, copy=False)
                                    for name in params}

    def __repr__(self):
        return (
            f"MultiHeadAttention(d_model={self.d_model}, n_heads={self.n_heads}, "
            f"n_kv_heads={self.n_kv_heads}, bias={self.bias}, dtype={self.dtype.name})"
        )
