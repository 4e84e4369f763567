"""Attention variants as score and mask functions: built-ins, user functions, block masks.

The functions have FlexAttention's signatures and go to :func:`kernels.attention`:

- ``mask_mod(b, h, q_idx, kv_idx) -> bool`` (True = attend) as ``mask_mod=``;
- ``score_mod(score, b, h, q_idx, kv_idx) -> float`` as ``score_mod=``; ``score`` is the
  scaled score ``q · k · scale``, before the additive ``mask``.

``h`` is the query head (under GQA too) and the indices are the raw ``q_idx``, ``kv_idx``
(no alignment offset).  Both combine with ``causal``, ``mask``, ``key_lengths``, dropout
and GQA.  A plain Python function or an ``@numba.njit`` one is accepted; the kernels
compile it into their inner loop (Numba inlines it: no Python call per element), the
reference backend evaluates it densely in float64.

>>> import numpy as np, kernels
>>> from kernels import mods
>>> q = k = v = np.ones((1, 4, 64, 16), np.float32)
>>> window = mods.sliding_window(8)                 # query i sees keys i-8 .. i
>>> out = kernels.attention(q, k, v, mask_mod=window, score_mod=mods.softcap(30.0))

Functions that need data bind it (``fn`` receives the arrays after its indices)::

    def same_document(b, h, q_idx, kv_idx, doc_ids):
        return doc_ids[b, q_idx] == doc_ids[b, kv_idx]

    kernels.attention(q, k, v, mask_mod=mods.mask_mod(same_document, doc_ids))

Calling again with other arrays of the same dtype and rank does not recompile.

Block sparsity: before a kernel walks the keys of a block of queries, it classifies each
tile of keys as empty (skipped: its keys and values are never read), full (no per-element
mask check) or partial.  Built-ins classify a tile in O(1) (``document`` in O(tile side));
a user mask function is evaluated on every pair of the tile.  :func:`block_mask`
computes the classification once, for reuse in later calls.
"""

from __future__ import annotations

import numbers
import time

import numpy as np

__all__ = [
    "sliding_window", "alibi", "softcap", "prefix_lm", "document", "relative_bias",
    "and_masks", "or_masks", "chain", "mask_mod", "score_mod", "block_mask",
    "MaskMod", "ScoreMod", "BlockMask",
]

#: Tile classes (see :func:`block_mask`).
EMPTY, PARTIAL, FULL = 0, 1, 2
#: Default query rows and keys per cell of a :func:`block_mask`.
BLOCK_MASK_CELL = 64


def _compile():
    from . import _mods_compile

    return _mods_compile


# --- the two kinds ------------------------------------------------------------------------------


class MaskMod:
    """A mask function with its bound data: ``(b, h, q_idx, kv_idx) -> bool`` (True = attend).

    Built by the built-ins, :func:`mask_mod`, :func:`and_masks`, :func:`or_masks` and
    :func:`block_mask`; :func:`kernels.attention` takes one as ``mask_mod=``.
    """

    kind = "mask_mod"
    #: True when tiles are classified without evaluating every pair.
    analytic = True
    #: Names of the user functions inside (for error messages).
    user_names: tuple = ()

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name

    def args(self, dtype=np.float64) -> tuple:
        """The bound data as one flat tuple (what the compiled functions receive)."""
        raise NotImplementedError

    def element(self, target: str = "cpu", dtype=np.float64):
        """The compiled ``m(b, h, q_idx, kv_idx, args) -> bool`` for ``target``."""
        raise NotImplementedError

    def tile(self, target: str = "cpu"):
        """The compiled ``t(b, h, i0, i1, j0, j1, args) -> EMPTY | PARTIAL | FULL``."""
        return _compile().exact_tile(target, self.element(target))

    def check(self, B: int, H: int, Lq: int, Lk: int) -> None:
        """Raise ValueError if the bound data does not fit a (B, H, Lq, Lk) problem."""

    def dense(self, B: int, H: int, Lq: int, Lk: int) -> np.ndarray:
        """The mask on every pair, bool (B, H, Lq, Lk): for the reference and tests."""
        return _compile().dense_visible(self, B, H, Lq, Lk)


class ScoreMod:
    """A score function with its bound data: ``(score, b, h, q_idx, kv_idx) -> float``.

    ``grad`` (the derivative with respect to ``score``, same signature) is what a
    backward pass needs; built-ins carry theirs.
    """

    kind = "score_mod"
    user_names: tuple = ()

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name

    def args(self, dtype=np.float64) -> tuple:
        """The bound data as one flat tuple, floats in ``dtype``."""
        raise NotImplementedError

    def element(self, target: str = "cpu", dtype=np.float64):
        """The compiled ``s(score, b, h, q_idx, kv_idx, args) -> float`` for ``dtype`` scores."""
        raise NotImplementedError

    def grad(self, target: str = "cpu", dtype=np.float64):
        """The compiled d s / d score (same signature); ValueError naming it if it has none."""
        raise NotImplementedError

    @property
    def has_grad(self) -> bool:
        return True

    def check(self, B: int, H: int, Lq: int, Lk: int) -> None:
        """Raise ValueError if the bound data does not fit a (B, H, Lq, Lk) problem."""

    def dense(self, scores: np.ndarray, dtype=np.float64) -> np.ndarray:
        """The function applied to every score (B, H, Lq, Lk), evaluated in ``dtype``."""
        return _compile().dense_scores(self, scores, dtype)

    def dense_grad(self, scores: np.ndarray) -> np.ndarray:
        """d s / d score at every score (B, H, Lq, Lk)."""
        return _compile().dense_grads(self, scores)


# --- built-in leaves -----------------------------------------------------------------------------


class _BuiltinMask(MaskMod):
    def __init__(self, name, element_source, tile_source, data, check=None):
        super().__init__(name)
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


class _BuiltinScore(ScoreMod):
    def __init__(self, name, source_factory, grad_factory, data, check=None):
        super().__init__(name)
        self._factory = source_factory
        self._grad_factory = grad_factory
        self._data = data  # floats are cast to the scores' dtype by args()
        self._check = check

    def args(self, dtype=np.float64):
        dtype = np.dtype(dtype)
        return tuple(
            x.astype(dtype) if isinstance(x, np.ndarray) and x.dtype.kind == "f"
            else (dtype.type(x) if isinstance(x, np.floating) else x)
            for x in self._data
        )

    def _build(self, factory, target, dtype):
        mc = _compile()
        dtype = np.dtype(dtype)
        return mc.memo(("builtin", target, factory, dtype.name),
                       lambda: mc.jit_for(target)(
                           factory(mc.scalar_type(dtype), mc.tanh_for(target, dtype))))

    def element(self, target="cpu", dtype=np.float64):
        return self._build(self._factory, target, dtype)

    def grad(self, target="cpu", dtype=np.float64):
        return self._build(self._grad_factory, target, dtype)

    def check(self, B, H, Lq, Lk):
        if self._check is not None:
            self._check(B, H, Lq, Lk)


def _int(name: str, x, minimum: int = 0) -> int:
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        raise TypeError(f"{name} must be an int; got {type(x).__name__}")
    if x < minimum:
        raise ValueError(f"{name} must be at least {minimum}; got {x}")
    return int(x)


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
    """
    left, right = _int("left", left), _int("right", right)
    return _BuiltinMask(f"sliding_window(left={left}, right={right})", _window_element,
                        _window_tile, (np.int64(left), np.int64(right)))


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
        raise TypeError(f"{name} has dtype {arr.dtype}; expected {expected}")
    if arr.ndim > 1:
        raise ValueError(f"{name} must be a scalar or 1-D; got shape {arr.shape}")
    return np.ascontiguousarray(arr.reshape(-1))


def prefix_lm(prefix_lengths) -> MaskMod:
    """Prefix-LM (T5, PaLI): key j is visible to query i if ``j < prefix_lengths[b]`` or ``j <= i``.

    Parameters
    ----------
    prefix_lengths : int or array_like of int, shape (B,)
        The bidirectional prefix of each batch entry (a scalar: the same for all).
    """
    lengths = _batch_vector("prefix_lengths", prefix_lengths, "int").astype(np.int64)
    if lengths.size == 0:
        raise ValueError("prefix_lengths is empty")
    if lengths.min() < 0:
        raise ValueError(f"prefix_lengths must be >= 0; got {lengths.min()}")

    def check(B, H, Lq, Lk):
        if lengths.shape[0] not in (1, B):
            raise ValueError(f"prefix_lengths has shape {lengths.shape}; expected ({B},) or a "
                             f"scalar for a batch of {B}")

    name = f"prefix_lm({lengths.tolist() if lengths.size <= 8 else '...'})"
    return _BuiltinMask(name, _prefix_element, _prefix_tile, (lengths,), check)


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
    """
    ids = np.asarray(doc_ids)
    if ids.dtype == np.bool_ or not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(f"doc_ids has dtype {ids.dtype}; expected integers")
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
                        (ids,), check)


# Score built-ins are written per dtype (F: the scores' Numba type, also a cast), so that
# no int64 or float64 value promotes float32 scores to float64.


def _alibi_source(F, tanh):
    def alibi(score, b, h, q_idx, kv_idx, args):
        return score + args[0][h] * F(kv_idx - q_idx)
    return alibi


def _unit_grad_source(F, tanh):
    def unit_grad(score, b, h, q_idx, kv_idx, args):
        return F(1)
    return unit_grad


def _softcap_source(F, tanh):
    def softcap(score, b, h, q_idx, kv_idx, args):
        cap = args[0]
        return cap * tanh(score / cap)
    return softcap


def _softcap_grad_source(F, tanh):
    def softcap_grad(score, b, h, q_idx, kv_idx, args):
        t = tanh(score / args[0])
        return F(1) - t * t
    return softcap_grad


def _relative_bias_source(F, tanh):
    def relative_bias(score, b, h, q_idx, kv_idx, args):
        table = args[0]
        R = (table.shape[1] - 1) // 2
        d = min(max(kv_idx - q_idx, -R), R)
        return score + table[h, d + R]
    return relative_bias


def _per_head(name: str, values, what: str):
    def check(B, H, Lq, Lk):
        if values.shape[0] != H:
            raise ValueError(f"{name} has {values.shape[0]} {what} for {H} query heads "
                             f"(shape {values.shape}); expected one per query head")
    return check


def alibi(slopes) -> ScoreMod:
    """ALiBi (BLOOM, MPT): ``score + slopes[h] · (kv_idx - q_idx)``, one slope per query head.

    Parameters
    ----------
    slopes : array_like of float, shape (H,)
        E.g. ``2 ** (-8 * (h + 1) / H)`` for the usual geometric slopes.
    """
    arr = np.asarray(slopes, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"slopes must be 1-D (one per query head); got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError("slopes must be finite")
    return _BuiltinScore(f"alibi({arr.size} slopes)", _alibi_source, _unit_grad_source,
                         (np.ascontiguousarray(arr),), _per_head("slopes", arr, "slopes"))


def softcap(cap: float) -> ScoreMod:
    """Logit soft-capping (Gemma 2): ``cap · tanh(score / cap)``.

    Parameters
    ----------
    cap : float > 0
    """
    if isinstance(cap, bool) or not isinstance(cap, numbers.Real):
        raise TypeError(f"cap must be a real number; got {type(cap).__name__}")
    if not (np.isfinite(cap) and cap > 0):
        raise ValueError(f"cap must be finite and > 0; got {cap}")
    return _BuiltinScore(f"softcap({cap})", _softcap_source, _softcap_grad_source,
                         (np.float64(cap),))


def relative_bias(table) -> ScoreMod:
    """Relative position bias: adds ``table[h, clip(kv_idx - q_idx, -R, R) + R]``.

    Parameters
    ----------
    table : array_like of float, shape (H, 2·R + 1)
        One row per query head; distances beyond ±R share the end entries.
    """
    arr = np.asarray(table, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[1] % 2 != 1:
        raise ValueError(f"table must have shape (H, 2*R + 1) (an odd width); got {arr.shape}")
    return _BuiltinScore(f"relative_bias(table {arr.shape})", _relative_bias_source,
                         _unit_grad_source, (np.ascontiguousarray(arr),),
                         _per_head("table", arr, "rows"))


# --- user functions ----------------------------------------------------------------------------


class _UserMask(MaskMod):
    analytic = False

    def __init__(self, fn, arrays):
        mc = _compile()
        self.fn = fn = mc.canonical(fn)
        self._arrays = arrays
        mc.check_arity("mask_mod", fn, 4, len(arrays))
        super().__init__(mc.describe("mask_mod", fn))
        self.user_names = (self.name,)
        mc.probe("mask_mod", fn, mc.INDEX_TYPES + mc.probe_types(arrays), mc.types.Boolean)

    def args(self, dtype=np.float64):
        return self._arrays

    def element(self, target="cpu", dtype=np.float64):
        return _compile().adapt_user(target, "mask_mod", self.fn, len(self._arrays))


class _UserScore(ScoreMod):
    def __init__(self, fn, arrays, grad):
        mc = _compile()
        self.fn = fn = mc.canonical(fn)
        self._arrays = arrays
        self._grad = grad = None if grad is None else mc.canonical(grad)
        mc.check_arity("score_mod", fn, 5, len(arrays))
        if grad is not None:
            mc.check_arity("score_mod grad", grad, 5, len(arrays))
        super().__init__(mc.describe("score_mod", fn))
        self.user_names = (self.name,) + (
            (mc.describe("score_mod grad", grad),) if grad is not None else ())
        self._probed = set()

    def probe(self, dtype) -> None:
        """Compile the function (and its grad) for scores of ``dtype``: TypeError if it fails."""
        dtype = np.dtype(dtype)
        if dtype in self._probed:
            return
        mc = _compile()
        arg_types = (mc.scalar_type(dtype),) + mc.INDEX_TYPES + mc.probe_types(self._arrays)
        mc.probe("score_mod", self.fn, arg_types, mc.types.Float)
        if self._grad is not None:
            mc.probe("score_mod grad", self._grad, arg_types, mc.types.Float)
        self._probed.add(dtype)

    def args(self, dtype=np.float64):
        return self._arrays

    def element(self, target="cpu", dtype=np.float64):
        self.probe(dtype)
        return _compile().adapt_user(target, "score_mod", self.fn, len(self._arrays))

    @property
    def has_grad(self) -> bool:
        return self._grad is not None

    def grad(self, target="cpu", dtype=np.float64):
        if self._grad is None:
            raise ValueError(
                f"{self.name} has no derivative: give it as "
                "kernels.mods.score_mod(fn, *arrays, grad=dfn) with dfn(score, b, h, q_idx, "
                "kv_idx, *arrays) = d fn / d score"
            )
        self.probe(dtype)
        return _compile().adapt_user(target, "score_mod", self._grad, len(self._arrays))


def _bound_arrays(arrays) -> tuple:
    mc = _compile()
    return tuple(mc.normalise_array(f"bound array {n}", a) for n, a in enumerate(arrays))


def mask_mod(fn, *arrays) -> MaskMod:
    """A user mask function ``fn(b, h, q_idx, kv_idx, *arrays) -> bool`` with bound arrays.

    ``fn`` is a plain Python function (compiled with ``numba.njit``) or an ``@numba.njit``
    one; it is compiled here, on the arrays' types, so that a function Numba cannot
    compile, of the wrong arity or returning something else than a bool raises a
    TypeError naming it now.  Binding other arrays of the same dtypes and ranks later
    does not recompile.  An exception raised inside ``fn`` while attention runs becomes
    a ValueError naming it.

    Parameters
    ----------
    fn : callable
    *arrays : array_like
        Received by ``fn`` after its indices (C-contiguous copies where needed).
    """
    if isinstance(fn, MaskMod):
        if arrays:
            raise TypeError(f"{fn!r} already has its data; mask_mod() binds arrays to a function")
        return fn
    if isinstance(fn, ScoreMod):
        raise TypeError(f"{fn!r} is a score function: pass it as score_mod=")
    return _UserMask(fn, _bound_arrays(arrays))


def score_mod(fn, *arrays, grad=None) -> ScoreMod:
    """A user score function ``fn(score, b, h, q_idx, kv_idx, *arrays) -> float``.

    As :func:`mask_mod`; the function is compiled (and checked) for the scores' dtype on
    first use, before any work.

    Parameters
    ----------
    fn : callable
    *arrays : array_like
        Received by ``fn`` after its indices.
    grad : callable, optional
        ``d fn / d score`` with ``fn``'s signature, for a backward pass (which raises a
        clear error without it).
    """
    if isinstance(fn, ScoreMod):
        if arrays or grad is not None:
            raise TypeError(f"{fn!r} already has its data and derivative")
        return fn
    if isinstance(fn, MaskMod):
        raise TypeError(f"{fn!r} is a mask function: pass it as mask_mod=")
    return _UserScore(fn, _bound_arrays(arrays), grad)


# --- combinations --------------------------------------------------------------------------------


class _CombinedMask(MaskMod):
    def __init__(self, op, first: MaskMod, second: MaskMod):
        super().__init__(f"{op}_masks({first!r}, {second!r})")
        self.op, self.first, self.second = op, first, second
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


def _masks(op: str, mods) -> MaskMod:
    if not mods:
        raise TypeError(f"{op}_masks needs at least one mask function")
    mods = [as_mask_mod(m) for m in mods]
    result = mods[0]
    for m in mods[1:]:
        result = _CombinedMask(op, result, m)
    return result


def and_masks(*masks) -> MaskMod:
    """A key is visible when every mask shows it (built-ins and plain functions alike)."""
    return _masks("and", masks)


def or_masks(*masks) -> MaskMod:
    """A key is visible when some mask shows it (built-ins and plain functions alike)."""
    return _masks("or", masks)


class _ChainedScore(ScoreMod):
    def __init__(self, first: ScoreMod, second: ScoreMod):
        super().__init__(f"chain({first!r}, {second!r})")
        self.first, self.second = first, second
        self.user_names = first.user_names + second.user_names

    def args(self, dtype=np.float64):
        return self.first.args(dtype) + self.second.args(dtype)

    def element(self, target="cpu", dtype=np.float64):
        return _compile().chain_scores(target, self.first.element(target, dtype),
                                       self.second.element(target, dtype),
                                       len(self.first.args(dtype)))

    @property
    def has_grad(self) -> bool:
        return self.first.has_grad and self.second.has_grad

    def grad(self, target="cpu", dtype=np.float64):
        return _compile().chain_grads(target, self.first.element(target, dtype),
                                      self.first.grad(target, dtype),
                                      self.second.grad(target, dtype),
                                      len(self.first.args(dtype)))

    def check(self, B, H, Lq, Lk):
        self.first.check(B, H, Lq, Lk)
        self.second.check(B, H, Lq, Lk)


def chain(*score_mods) -> ScoreMod:
    """Score functions applied left to right: ``chain(f, g)(s) = g(f(s))``."""
    if not score_mods:
        raise TypeError("chain needs at least one score function")
    mods = [as_score_mod(s) for s in score_mods]
    result = mods[0]
    for s in mods[1:]:
        result = _ChainedScore(result, s)
    return result


# --- block masks ---------------------------------------------------------------------------------


def _table_tile(b, h, i0, i1, j0, j1, args):
    table, cell_q, cell_k = args[0], args[1], args[2]
    bb = b if table.shape[0] > 1 else 0
    hh = h if table.shape[1] > 1 else 0
    seen = False
    full = True
    for ci in range((i0 // cell_q), (i1 - 1) // cell_q + 1):
        for cj in range((j0 // cell_k), (j1 - 1) // cell_k + 1):
            c = table[bb, hh, ci, cj]
            if c != EMPTY:
                seen = True
            if c != FULL:
                full = False
    if not seen:
        return EMPTY
    return FULL if full else PARTIAL


class BlockMask(MaskMod):
    """A mask function with its tiles classified once (see :func:`block_mask`).

    Attributes
    ----------
    mask_mod : MaskMod
        The mask it classifies (evaluated per element in partial tiles).
    table : ndarray of int8, shape (B or 1, H or 1, ceil(Lq / cell_q), ceil(Lk / cell_k))
        EMPTY (0), PARTIAL (1) or FULL (2) per cell.
    seconds : float
        How long the classification took.
    """

    def __init__(self, inner: MaskMod, table: np.ndarray, cell_q: int, cell_k: int,
                 Lq: int, Lk: int, seconds: float):
        super().__init__(f"block_mask({inner!r}, table {table.shape})")
        self.mask_mod = inner
        self.table = table
        self.cell_q, self.cell_k, self.Lq, self.Lk = cell_q, cell_k, Lq, Lk
        self.seconds = seconds
        self.user_names = inner.user_names

    def args(self, dtype=np.float64):
        cells = (self.table, np.int64(self.cell_q), np.int64(self.cell_k))
        return cells + self.mask_mod.args(dtype)

    def element(self, target="cpu", dtype=np.float64):
        mc = _compile()
        inner = self.mask_mod.element(target)

        def build():
            def element(b, h, q_idx, kv_idx, args):
                return inner(b, h, q_idx, kv_idx, args[3:])
            return mc.jit_for(target)(element)

        return mc.memo(("block_mask", target, inner), build)

    def tile(self, target="cpu"):
        mc = _compile()
        return mc.memo(("builtin", target, _table_tile), lambda: mc.jit_for(target)(_table_tile))

    def density(self) -> float:
        """The fraction of cells that are not empty."""
        return float((self.table != EMPTY).mean()) if self.table.size else 0.0

    def check(self, B, H, Lq, Lk):
        Bt, Ht = self.table.shape[:2]
        if (Lq, Lk) != (self.Lq, self.Lk) or Bt not in (1, B) or Ht not in (1, H):
            raise ValueError(
                f"{self!r} was computed for B={Bt}, H={Ht}, Lq={self.Lq}, Lk={self.Lk}; the "
                f"call has B={B}, H={H}, Lq={Lq}, Lk={Lk}"
            )
        self.mask_mod.check(B, H, Lq, Lk)


def block_mask(mask_mod, B, H, Lq: int, Lk: int, *, cell_q: int = BLOCK_MASK_CELL,
               cell_k: int = BLOCK_MASK_CELL) -> BlockMask:
    """Classify the tiles of ``mask_mod`` once, for reuse in later calls (``mask_mod=``).

    Each cell of ``cell_q`` queries x ``cell_k`` keys is EMPTY (no visible pair: a
    kernel skips it and never reads its keys), FULL (every pair visible: no per-element
    check) or PARTIAL.  A user function is evaluated on every pair here, once; built-ins
    classify cells without that.  Kernels use any tiling: a tile is classified from the
    cells it overlaps.

    Parameters
    ----------
    mask_mod : MaskMod or callable
    B, H : int or None
        Batch and query heads; ``None`` (as in FlexAttention) classifies for b = 0 (h = 0)
        and serves every batch entry (head): only for masks that do not depend on it.
    Lq, Lk : int
    cell_q, cell_k : int, default 64

    Returns
    -------
    BlockMask
    """
    mod = as_mask_mod(mask_mod)
    if isinstance(mod, BlockMask):
        mod = mod.mask_mod
    Bn = 1 if B is None else _int("B", B, 1)
    Hn = 1 if H is None else _int("H", H, 1)
    Lq, Lk = _int("Lq", Lq), _int("Lk", Lk)
    cell_q, cell_k = _int("cell_q", cell_q, 1), _int("cell_k", cell_k, 1)
    mod.check(Bn, Hn, Lq, Lk)
    start = time.perf_counter()
    table = _compile().classify_cells(mod, Bn, Hn, Lq, Lk, cell_q, cell_k)
    return BlockMask(mod, table, cell_q, cell_k, Lq, Lk, time.perf_counter() - start)


# --- coercion (kernels.attention's mask_mod= and score_mod=) --------------------------------------


def as_mask_mod(x) -> MaskMod:
    """``x`` as a :class:`MaskMod`: itself, or a plain function wrapped by :func:`mask_mod`."""
    if isinstance(x, MaskMod):
        return x
    return memo_user("mask", x, lambda: mask_mod(x))


def as_score_mod(x) -> ScoreMod:
    """``x`` as a :class:`ScoreMod`: itself, or a plain function wrapped by :func:`score_mod`."""
    if isinstance(x, ScoreMod):
        return x
    return memo_user("score", x, lambda: score_mod(x))


_USER_MODS: dict = {}


def memo_user(kind, fn, build):
    """A plain function passed directly is wrapped (and checked) once."""
    try:
        key = (kind, fn)
        hash(key)
    except TypeError:
        return build()
    if key not in _USER_MODS:
        _USER_MODS[key] = build()
    return _USER_MODS[key]
