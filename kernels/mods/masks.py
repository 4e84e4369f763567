"""Built-in mask functions of :mod:`kernels.mods` (windows, prefix-LM, documents) and their
combinations (:func:`and_masks`, :func:`or_masks`).

Each has an element function (one pair) and a tile function (a block of pairs: EMPTY,
PARTIAL or FULL) written once and compiled for the CPU (``numba.njit``) and the GPU
(``cuda.jit(device=True)``)."""

from __future__ import annotations

import numpy as np

from .._problems.arrays import require_integers, wrong_dtype, wrong_shape
from .base import MaskMod, _compile, _int, source_name
from .cells import EMPTY, FULL, PARTIAL
from .user import as_mask_mod


class _BuiltinMask(MaskMod):
    def __init__(self, name, element_source, tile_source, data, check=None, formula=None):
        super().__init__(name)
        self.formula = formula
        self._element_source = element_source
        self._tile_source = tile_source
        self._data = data
        self._check = check

    def args(self, dtype=np.float64):
        return self._data

    def element(self, target="cpu", dtype=np.float64):
        mc = _compile()
        return mc.memo(("builtin", target, self._element_source),
                       lambda: mc.jit_for(target)(self._element_source))

    def tile(self, target="cpu"):
        mc = _compile()
        return mc.memo(("builtin", target, self._tile_source),
                       lambda: mc.jit_for(target)(self._tile_source))

    def check(self, B, H, Lq, Lk):
        if self._check is not None:
            self._check(B, H, Lq, Lk)

    def cache_key(self, part, dtype=np.float64):
        return source_name(self._tile_source if part == "tile" else self._element_source)


def _window_element(b, h, q_idx, kv_idx, args):
    return (kv_idx >= q_idx - args[0]) & (kv_idx <= q_idx + args[1])  # & and |: no branch


def _window_tile(b, h, i0, i1, j0, j1, args):
    left, right = args[0], args[1]
    if j1 - 1 < i0 - left or j0 > i1 - 1 + right:
        return EMPTY
    if j0 >= i1 - 1 - left and j1 - 1 <= i0 + right:
        return FULL
    return PARTIAL


def sliding_window(left: int, right: int = 0) -> MaskMod:
    """Query i sees keys j with ``i - left <= j <= i + right`` (inclusive).

    As JAX's ``local_window_size=(left, right)``: ``left=256`` sees 257 keys including its
    own position.  Combine with ``causal=True`` (or keep ``right=0``) for a causal window.

    Parameters
    ----------
    left, right : int >= 0
        Keys seen before and after the query's own position.

    Returns
    -------
    MaskMod
        For ``mask_mod=`` of :func:`kernels.attention` and :func:`kernels.attention_backward`.
    """
    left, right = _int("left", left), _int("right", right)
    return _BuiltinMask(f"sliding_window(left={left}, right={right})", _window_element,
                        _window_tile, (np.int64(left), np.int64(right)),
                        formula=("sliding_window", left, right))


def _prefix_element(b, h, q_idx, kv_idx, args):
    lengths = args[0]
    n = lengths[b if lengths.shape[0] > 1 else 0]
    return (kv_idx < n) | (kv_idx <= q_idx)


def _prefix_tile(b, h, i0, i1, j0, j1, args):
    lengths = args[0]
    n = lengths[b if lengths.shape[0] > 1 else 0]
    if j1 - 1 < n or j1 - 1 <= i0:
        return FULL
    if j0 >= n and j0 > i1 - 1:
        return EMPTY
    return PARTIAL


def _batch_vector(name: str, x, kind: str) -> np.ndarray:
    """A scalar or a vector of shape (B,) as a 1-D array (length 1 broadcasts)."""
    arr = np.asarray(x)
    ok = np.issubdtype(arr.dtype, np.integer) if kind == "int" else (
        np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer))
    if arr.dtype == np.bool_ or not ok:
        expected = "integers" if kind == "int" else "floats"
        raise wrong_dtype(name, arr.dtype, f"{expected}")
    if arr.ndim > 1:
        raise ValueError(f"{name} must be a scalar or 1-D; got shape {arr.shape}")
    return np.ascontiguousarray(arr.reshape(-1))


def prefix_lm(prefix_lengths) -> MaskMod:
    """Prefix-LM (T5, PaLI): key j is visible to query i if ``j < prefix_lengths[b]`` or ``j <= i``.

    Parameters
    ----------
    prefix_lengths : int or array_like of int, shape (B,)
        The bidirectional prefix of each batch entry (a scalar: the same for all).

    Returns
    -------
    MaskMod
        For ``mask_mod=`` of :func:`kernels.attention` and :func:`kernels.attention_backward`.
    """
    lengths = _batch_vector("prefix_lengths", prefix_lengths, "int").astype(np.int64)
    if lengths.size == 0:
        raise ValueError("prefix_lengths is empty")
    if lengths.min() < 0:
        raise ValueError(f"prefix_lengths must be >= 0; got {lengths.min()}")

    def check(B, H, Lq, Lk):
        if lengths.shape[0] not in (1, B):
            raise wrong_shape("prefix_lengths", lengths.shape, f"({B},) or a "
                              f"scalar for a batch of {B}")

    name = f"prefix_lm({lengths.tolist() if lengths.size <= 8 else '...'})"
    return _BuiltinMask(name, _prefix_element, _prefix_tile, (lengths,), check,
                        formula=("prefix_lm", lengths))


def _document_element(b, h, q_idx, kv_idx, args):
    ids = args[0]
    row = b if ids.shape[0] > 1 else 0
    return ids[row, q_idx] == ids[row, kv_idx]


def _document_tile(b, h, i0, i1, j0, j1, args):
    ids = args[0]
    row = b if ids.shape[0] > 1 else 0
    q_lo = q_hi = ids[row, i0]
    for i in range(i0 + 1, i1):
        q_lo = min(q_lo, ids[row, i])
        q_hi = max(q_hi, ids[row, i])
    k_lo = k_hi = ids[row, j0]
    for j in range(j0 + 1, j1):
        k_lo = min(k_lo, ids[row, j])
        k_hi = max(k_hi, ids[row, j])
    if q_hi < k_lo or k_hi < q_lo:
        return EMPTY
    if q_lo == q_hi and k_lo == k_hi and q_lo == k_lo:
        return FULL
    return PARTIAL


def document(doc_ids) -> MaskMod:
    """Document masking for packed sequences: a query sees only keys of its own document.

    Combine with ``causal=True`` for a packed causal LM.  Tiles are classified from the
    smallest and largest id among their queries and keys, so contiguous documents (ids
    sorted along L) skip every tile between two documents.

    Parameters
    ----------
    doc_ids : array_like of int, shape (B, L) or (L,)
        The document of each position; the call must have Lq = Lk = L (a 1-D ``doc_ids``
        serves every batch entry).

    Returns
    -------
    MaskMod
        For ``mask_mod=`` of :func:`kernels.attention` and :func:`kernels.attention_backward`.
    """
    ids = require_integers("doc_ids", doc_ids)
    if ids.ndim == 1:
        ids = ids[None]
    if ids.ndim != 2:
        raise ValueError(f"doc_ids must have shape (B, L) or (L,); got {np.shape(doc_ids)}")
    ids = np.ascontiguousarray(ids, dtype=np.int64)

    def check(B, H, Lq, Lk):
        if not (Lq == Lk == ids.shape[1]) or ids.shape[0] not in (1, B):
            raise ValueError(
                f"document(doc_ids) needs doc_ids of shape ({B}, L) with Lq = Lk = L; got "
                f"doc_ids {ids.shape} for Lq={Lq}, Lk={Lk}"
            )

    return _BuiltinMask(f"document(doc_ids {ids.shape})", _document_element, _document_tile,
                        (ids,), check, formula=("document", ids))


# Score built-ins are written per dtype (F: the scores' Numba type, also a cast), so that
# no int64 or float64 value promotes float32 scores to float64.


# --- combinations --------------------------------------------------------------------------------


class _CombinedMask(MaskMod):
    def __init__(self, op, first: MaskMod, second: MaskMod):
        super().__init__(f"{op}_masks({first!r}, {second!r})")
        self.op, self.first, self.second = op, first, second
        self.formula = (op, first, second)
        self.analytic = first.analytic and second.analytic
        self.user_names = first.user_names + second.user_names

    def args(self, dtype=np.float64):
        return self.first.args(dtype) + self.second.args(dtype)

    def _split(self):
        return len(self.first.args())

    def element(self, target="cpu", dtype=np.float64):
        return _compile().combine_masks(target, self.op, self.first.element(target),
                                        self.second.element(target), self._split())

    def tile(self, target="cpu"):
        return _compile().combine_tiles(target, self.op, self.first.tile(target),
                                        self.second.tile(target), self._split())

    def check(self, B, H, Lq, Lk):
        self.first.check(B, H, Lq, Lk)
        self.second.check(B, H, Lq, Lk)

    def cache_key(self, part, dtype=np.float64):
        keys = (self.first.cache_key(part, dtype), self.second.cache_key(part, dtype))
        if None in keys:
            return None
        return f"{self.op}_{part}({keys[0]}, {keys[1]}, {self._split()})"


def _masks(op: str, mods) -> MaskMod:
    if not mods:
        raise TypeError(f"{op}_masks needs at least one mask function")
    mods = [as_mask_mod(m) for m in mods]
    result = mods[0]
    for m in mods[1:]:
        result = _CombinedMask(op, result, m)
    return result


def and_masks(*masks) -> MaskMod:
    """A key is visible when every mask shows it (built-ins and plain functions alike).

    Parameters
    ----------
    *masks : MaskMod or callable
        One or more; a plain function is wrapped by :func:`mask_mod`.

    Returns
    -------
    MaskMod
        Their intersection; a tile is EMPTY when any of them calls it EMPTY.
    """
    return _masks("and", masks)


def or_masks(*masks) -> MaskMod:
    """A key is visible when some mask shows it (built-ins and plain functions alike).

    Parameters
    ----------
    *masks : MaskMod or callable
        One or more, as for :func:`and_masks`.

    Returns
    -------
    MaskMod
        Their union; a tile is FULL when any of them calls it FULL.
    """
    return _masks("or", masks)
