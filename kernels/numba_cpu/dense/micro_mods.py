"""The micro-kernel path with a ``mask_mod`` and/or a ``score_mod`` (:mod:`kernels.mods`).

The same packed K/V panels and the same two products as :mod:`kernels.numba_cpu.dense.micro`
(``S = Q_blk · K_tileᵀ`` and ``acc += P · V`` by :func:`~kernels.numba_cpu.dense.micro.tile_product`
register blocks), with every semantic of the tile kernel's mods
(:func:`kernels.numba_cpu.dense.forward.run_tiles`):

- with a mask function the keys of a query block go in cells of ``cell_k`` keys
  (``config.CELL_K``, rounded up to a multiple of ``nr`` so that a cell starts on a
  panel), classified by :func:`kernels.numba_cpu.dense.mods.classify` (the mask's tile
  function and the causal diagonal): an EMPTY cell is skipped (neither product reads
  its keys or values), the tiles are runs of non-empty cells of at most ``block_k``
  keys, a FULL run evaluates no mask element, a PARTIAL one sets each hidden score to
  ``-inf`` after the product (a garbage key reaches only its own, hidden, score);
- the score function is applied to each visible scaled score (``score_mod(scale · q·k)``);
- a row that sees no key gives 0 (lse ``-inf``), a visible NaN score a NaN row;
- ``P · V`` of a partly hidden tile whose values are not all finite (a flag per key,
  set when the values are packed) runs on a copy with those entries replaced by 0, so a
  row that does not see them gets the bits it gets with any finite value there; a row
  that sees one then adds their terms, so that it is inf or NaN as in the reference.

Packing copies every key and value up to ``key_lengths[b]`` into the panels (as the
plain path does), hidden or not; only the products above read them.  The kernels are
cached on disk for built-in mods (:func:`kernels.mods.cache.cacheable`); a user function
gets twins compiled without ``cache=True`` (its dispatcher type cannot be found again).
"""

from __future__ import annotations

import numpy as np
from numba import literally, njit, prange

from ..._jit.launch import launch_guard
from ..._jit.math import FASTMATH, float_constants, max_key
from ..._jit.twins import uncached_twin
from ..._problems.dense import AttentionProblem
from ...mods import cache as mods_cache
from ...mods.dense import run_user_code
from ...mods.lowering import user_names
from .. import config
from .forward import mod_functions
from .micro import (
    BLOCK_K,
    BLOCK_Q,
    block_state,
    finish_rows,
    launch_kernel,
    outputs,
    pack_head,
    row_softmax,
    tile_scores,
    tile_values,
)
from .mods import cell_run

__all__ = ["run"]


@njit(fastmath=FASTMATH, error_model="numpy", cache=True)
def _flag_values(vp_bh, key_end, Dv, bad):
    """bad[j] = some value of key j (< key_end) is inf or NaN (x · 0 is NaN for those)."""
    for j in range(key_end):
        t = vp_bh[j, 0] * 0
        for d in range(Dv):
            t += vp_bh[j, d] * 0
        bad[j] = not t == 0


@njit(fastmath=FASTMATH, error_model="numpy", cache=True)
def _prepare_head(k, v, key_end, b, hk, kp_bh, vp_bh, bad_bh):
    """Pack (b, hk) as the plain path does, and flag its non-finite values."""
    pack_head(k, v, key_end, b, hk, kp_bh, vp_bh)
    _flag_values(vp_bh, key_end, v.shape[3], bad_bh)


@njit(fastmath=FASTMATH, error_model="numpy")  # not cached: it may take a user function
def _sees(causal, i, causal_offset, j, full, mask_fn, b, h, mask_args):
    """Whether row i sees key j of a tile (j past the key length never comes here)."""
    if causal and j > i + causal_offset:
        return False
    if mask_fn is not None and not full:
        return mask_fn(b, h, i, j, mask_args)
    return True


@njit(fastmath=FASTMATH, error_model="numpy")  # not cached, as _sees
def _values_hiding_bad(s, vp, bad, acc, j0, nk, r_lo, r_al, n, block_k, i0, b, h, causal,
                       causal_offset, full, mask_fn, mask_args, mr, nr):
    """``acc += P · V_tile`` for a partly hidden tile holding non-finite values (module
    docstring): the product on a cleaned copy, then the visible non-finite terms."""
    Dv_pad = vp.shape[1]  # lanes past Dv hold 0
    zero = float_constants(s[0])[0]
    clean = np.empty((nk, Dv_pad), dtype=vp.dtype)
    for c in range(nk):
        for d in range(Dv_pad):
            x = vp[j0 + c, d]
            clean[c, d] = x if x * 0 == 0 else zero
    tile_values(s, clean.reshape(-1), 0, acc, nk, r_al, block_k, Dv_pad, mr, nr)
    for r in range(r_lo, n):
        for c in range(nk):
            if bad[j0 + c] and _sees(causal, i0 + r, causal_offset, j0 + c, full, mask_fn, b,
                                     h, mask_args):
                for d in range(Dv_pad):
                    x = vp[j0 + c, d]
                    if not x * 0 == 0:
                        acc[r * Dv_pad + d] += s[r * block_k + c] * x


@njit(fastmath=FASTMATH, error_model="numpy", cache=True)
def _attend_mods(q, kp, vp, bad, key_lengths, causal, causal_offset, scale, out, lse, b, h,
                 i0, i1, block_k, cell_k, mr, nr, mask_fn, tile_fn, mask_args, score_fn,
                 score_args):
    """Rows [i0, i1) of (b, h) against its packed keys and values, with the mods."""
    D, Dv_pad = q.shape[3], vp.shape[1]
    n = i1 - i0
    qb, s, s_rows, acc, row_max, row_sum, row_nan = block_state(q, scale, b, h, i0, i1,
                                                                block_k, Dv_pad, mr)
    kp_f, vp_f = kp.reshape(-1), vp.reshape(-1)
    zero, _, neg_inf = float_constants(scale)
    no_mask = np.zeros(1, dtype=np.bool_)  # classify's dense mask: none here
    key_end = key_lengths[b]
    if causal:
        key_end = min(key_end, max(i1 + causal_offset, 0))
    j = 0
    while j < key_end:  # key tiles [j0, j1)
        full = True  # no pair of the tile is hidden by the mask function
        if tile_fn is None:
            j0, j1 = j, min(j + block_k, key_end)
        else:  # a run of non-empty cells, at most block_k keys
            j0, j1, full = cell_run(j, key_end, block_k, cell_k, b, h, i0, i1, tile_fn,
                                    mask_args, causal, causal_offset, no_mask, 0, 0, 0, False,
                                    neg_inf)
        j = j1
        nk = j1 - j0
        if nk <= 0:
            continue
        r_lo = min(max(j0 - causal_offset - i0, 0), n) if causal else 0  # first row seeing j0
        r_al = r_lo - r_lo % mr
        tile_scores(qb, kp_f, s, D, j0, nk, r_al, block_k, mr, nr)
        partial = not full or (causal and j1 - 1 > i0 + r_al + causal_offset)
        for r in range(r_al, s_rows.shape[0]):
            row = s_rows[r]
            i = i0 + r
            hi = 0  # keys [j0, j0 + hi) may be visible to this row
            if r >= r_lo and r < n:
                hi = nk
                if causal:
                    hi = max(min(nk, i + causal_offset + 1 - j0), 0)
            key_max = max_key(neg_inf)
            n_visible = hi
            if mask_fn is not None and not full:  # branch-free: the loop vectorises
                n_visible = 0
                for c in range(hi):
                    x = row[c] * scale
                    if score_fn is not None:
                        x = score_fn(x, b, h, i, j0 + c, score_args)
                    seen = mask_fn(b, h, i, j0 + c, mask_args)
                    x = x if seen else neg_inf
                    row[c] = x
                    n_visible += seen
                    key_max = max(key_max, max_key(x))
            else:
                for c in range(hi):
                    x = row[c] * scale
                    if score_fn is not None:
                        x = score_fn(x, b, h, i, j0 + c, score_args)
                    row[c] = x
                    key_max = max(key_max, max_key(x))
            row_softmax(row, hi, n_visible, nk, key_max, r, row_max, row_sum, row_nan, acc,
                        Dv_pad)
        any_bad = False
        if partial:
            for c in range(nk):
                any_bad |= bad[j0 + c]
        if any_bad:
            _values_hiding_bad(s, vp, bad, acc, j0, nk, r_lo, r_al, n, block_k, i0, b, h,
                               causal, causal_offset, full, mask_fn, mask_args, mr, nr)
        else:
            tile_values(s, vp_f, j0, acc, nk, r_al, block_k, Dv_pad, mr, nr)
    finish_rows(acc, row_max, row_sum, row_nan, out, lse, b, h, i0, Dv_pad)


@njit(parallel=True, cache=True)
def _pack_heads(k, v, key_lengths, kps, vps, bads):
    """Every (batch, key head) ``bh`` packed into ``kps[bh]``, ``vps[bh]``, ``bads[bh]``."""
    Hkv = k.shape[1]
    for bh in prange(kps.shape[0]):
        _prepare_head(k, v, key_lengths[bh // Hkv], bh // Hkv, bh % Hkv, kps[bh], vps[bh],
                      bads[bh])


@njit(parallel=True, cache=True)
def _kernel_mods(q, k, v, key_lengths, causal, causal_offset, scale, out, lse, block_q,
                 block_k, cell_k, fuse, mask_fn, tile_fn, mask_args, score_fn, score_args,
                 mr, nr):
    """The forward with mods by ``mr`` x ``nr`` register blocks.  ``fuse``: a task per
    (batch, key head) packs it, then runs all its query blocks; else one packing launch,
    then a task per query block.

    Both ways are one parallel loop with one call of :func:`_attend_mods`: Numba compiles
    each parallel loop on its own with all it calls, and the packing launch
    (:func:`_pack_heads`) does not depend on the mods.  A cold compile of one mods
    specialisation took 20.7 s with a loop per way, 16 s so (and 3.5 s for the packing,
    once per dtype)."""
    literally(mr)
    literally(nr)
    B, H, Lq = q.shape[0], q.shape[1], q.shape[2]
    Hkv, Lk, D, Dv_pad = k.shape[1], k.shape[2], k.shape[3], -(-v.shape[3] // nr) * nr
    n_blocks, group = -(-Lq // block_q), H // Hkv
    packed = 0 if fuse else B * Hkv  # heads packed before the loop
    kps = np.empty((packed, -(-Lk // nr), D, nr), dtype=q.dtype)
    vps = np.empty((packed, Lk, Dv_pad), dtype=q.dtype)
    bads = np.zeros((packed, Lk), dtype=np.bool_)
    per_head = group * n_blocks  # query blocks of a key head's group
    n_tasks = B * Hkv
    if not fuse:
        _pack_heads(k, v, key_lengths, kps, vps, bads)
        n_tasks = B * Hkv * per_head
    # n_tasks is set by a branch: Numba silently runs a prange over ``x if c else y`` on
    # one thread.
    for task in prange(n_tasks):
        task = np.int64(task)  # unsigned in the function Numba outlines for the loop
        if fuse:  # task bh = (b, hk): pack it, then run all its query blocks
            bh, first, stop = task, 0, per_head
            kp = np.empty((-(-Lk // nr), D, nr), dtype=q.dtype)
            vp = np.empty((Lk, Dv_pad), dtype=q.dtype)
            bad = np.zeros(Lk, dtype=np.bool_)
            _prepare_head(k, v, key_lengths[bh // Hkv], bh // Hkv, bh % Hkv, kp, vp, bad)
        else:  # one query block (b, h, block) of a packed head
            bh, first = task // per_head, task % per_head
            stop = first + 1
            kp, vp, bad = kps[bh], vps[bh], bads[bh]
        b, hk = bh // Hkv, bh % Hkv
        for t in range(first, stop):  # one call site: _attend_mods is compiled in once
            h, i0 = hk * group + t // n_blocks, (t % n_blocks) * block_q
            _attend_mods(q, kp, vp, bad, key_lengths, causal, causal_offset, scale, out, lse,
                         b, h, i0, min(i0 + block_q, Lq), block_k, cell_k, mr, nr, mask_fn,
                         tile_fn, mask_args, score_fn, score_args)


# For calls with a user's function: not cached on disk (kernels._jit.twins).
_kernel_mods_user = uncached_twin(_kernel_mods, _attend_mods)


def run(problem: AttentionProblem, config_block, *, block_q: int = BLOCK_Q,
        block_k: int = BLOCK_K, cell_k: int | None = None, fuse=None):
    """``(out, lse)`` of a validated problem with a ``mask_mod`` and/or ``score_mod``.

    Parameters
    ----------
    problem : AttentionProblem
        Causal, key_lengths, scale and mods (a dense mask as mods:
        :func:`kernels.mods.dense_mask.as_mods`); no ``mask``, dropout or weights.
    config_block : (int, int)
        The register block ``(mr, nr)`` (:data:`kernels.numba_cpu.dense.micro.CONFIGS`).
    block_q, block_k : int
        Query rows per task and keys per tile at most (``block_k`` rounded up to a
        multiple of the cell).
    cell_k : int, optional
        Keys per cell of the mask's classification (rounded up to a multiple of ``nr``);
        default ``config.CELL_K``.
    fuse : bool, optional
        As :func:`kernels.numba_cpu.dense.micro.run`.

    Returns
    -------
    out : ndarray, shape (B, H, Lq, Dv)
    lse : ndarray, shape (B, H, Lq)
        ``m + log ℓ`` of each row (``-inf`` for a row that sees no key).
    """
    if problem.mask is not None or problem.dropout_p or problem.return_weights:
        raise ValueError("the micro-kernel path takes no mask, dropout or weights")
    mr, nr = config_block
    cell_k = -(-(cell_k or config.CELL_K) // nr) * nr
    block_k = -(-block_k // cell_k) * cell_k
    fuse, out, lse = outputs(problem, fuse)
    dtype = problem.dtype.type
    if not out.size:
        return out, lse
    mods = mod_functions(problem)
    cached = all(f is None or mods_cache.all_cached(f) for f in (mods[0], mods[1], mods[3]))
    args = (problem.q, problem.k, problem.v, problem.key_lengths_or_full(),
            problem.causal_offset is not None, problem.causal_offset or 0,
            dtype(problem.scale), out, lse, block_q, block_k, cell_k, bool(fuse)) + mods
    with launch_guard():
        run_user_code(user_names(problem), launch_kernel, args, mr, nr,
                      _kernel_mods if cached else _kernel_mods_user)
    return out, lse
