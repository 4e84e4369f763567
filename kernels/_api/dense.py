"""The API of :mod:`kernels`: :func:`attention`, :func:`attention_backward`, :func:`prepare`
and the numba backend's planning (:func:`plan`, :func:`plan_needed`, :func:`attention_plan`).

Each function validates (:mod:`kernels._problems.checks`), then hands the problem to a backend
through the one dispatch table (:mod:`kernels._api.dispatch`).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .._dtypes import compute_dtype
from .._problems.checks import (
    check_attention_args,
    check_backend,
    check_backward_args,
    check_deterministic,
    check_mods,
)
from .._problems.dense import AttentionProblem, multiply_adds
from .._problems.sinks import check_sinks, keys_only_lse, merge_sinks, sink_gradient
from .dispatch import entry_module, resolve

__all__ = ["attention", "attention_backward", "attention_plan", "compiled_forms", "plan",
           "plan_needed", "prepare"]


def attention(q, k, v, *, causal=False, mask=None, key_lengths=None, scale=None,
              dropout_p=0.0, seed=None, backend="auto", return_weights=False,
              return_lse=False, score_mod=None, mask_mod=None, sinks=None):
    """Masked multi-head scaled dot-product attention, ``softmax(q kᵀ · scale + mask) v``.

    Semantics follow PyTorch's ``scaled_dot_product_attention`` where it has the feature.

    Parameters
    ----------
    q : ndarray, shape (..., H, Lq, D), or (H, Lq, D), or (Lq, D)
        Queries: float32, float64, float16 or ``ml_dtypes.bfloat16`` (half inputs are
        computed with float32 scores, softmax and accumulators, docs/guide/half.md).
    k : ndarray, shape (..., Hkv, Lk, D)
        Keys, same dtype. H must be a multiple of Hkv (GQA/MQA): query head h reads
        key/value head ``h // (H // Hkv)``.
    v : ndarray, shape (..., Hkv, Lk, Dv)
        Values, same dtype.
    causal : bool or {"top-left", "bottom-right"}, default False
        ``True``/``"top-left"``: query i sees keys j <= i (PyTorch's ``is_causal``).
        ``"bottom-right"``: query i sees keys j <= i + Lk - Lq (FlashAttention; decoding).
    mask : array_like, optional
        Broadcastable to (..., H, Lq, Lk). bool: True = attend (as PyTorch and Hugging
        Face); float: added to the scores (``-inf`` hides a key).
    key_lengths : int or array_like of int, shape (...,), optional
        Keys ``j >= key_lengths[b]`` are padding: the fast way to mask padding (no L x L mask).
    scale : float, optional
        Multiplies ``q · k``; default ``1 / sqrt(D)``. ``scale=1.0`` is the unscaled variant.
    dropout_p : float, default 0.0
        Probability of dropping each attention weight, with inverted scaling ``1 / (1 - p)``.
    seed : int, optional
        Dropout seed in [0, 2**32). The decision for (seed, b, h, i, j) comes from a
        stateless hash shared by every backend, so all backends drop the same weights.
        ``None`` with ``dropout_p > 0`` draws a fresh seed.
    backend : {"auto", "reference", "numba", "cuda"}, default "auto"
        ``"auto"`` picks numba, or cuda on a real GPU for large problems.
    return_weights : bool, default False
        Also return the softmax weights (..., H, Lq, Lk), before dropout. Only then is an
        L x L array materialised.
    return_lse : bool, default False
        Also return the log-sum-exp of each query row's visible scores,
        ``lse[..., h, i] = log Σ_j exp(scale · q_i · k_j + mask_ij)`` (before dropout),
        ``-inf`` for a row that sees no key: what :func:`attention_backward` needs.
    score_mod : callable or kernels.mods.ScoreMod, optional
        ``score_mod(score, b, h, q_idx, kv_idx) -> float`` (FlexAttention's signature),
        applied to every scaled score before the additive ``mask``; ``h`` is the query
        head.  A plain or ``@numba.njit`` function, or a :mod:`kernels.mods` built-in
        (``alibi``, ``softcap``, ``relative_bias``, ``chain``, ``score_mod(fn, *arrays)``).
    mask_mod : callable or kernels.mods.MaskMod, optional
        ``mask_mod(b, h, q_idx, kv_idx) -> bool`` (True = attend), combined with the other
        masks; tiles it hides entirely are skipped.  E.g. ``kernels.mods.sliding_window``,
        ``document``, ``prefix_lm``, ``and_masks``, ``block_mask``.
    sinks : ndarray, shape (H,), optional
        Attention sinks: one finite logit per query head, in q's dtype and in the units of
        the scaled scores after ``score_mod`` and the mask (neither applies to it), that
        joins every row's softmax denominator and has no value:
        ``out = Σ_j e^(s_j - m) v_j / (Σ_j e^(s_j - m) + e^(sink_h - m))``,
        ``m = max(max_j s_j, sink_h)``.  ``lse`` and the weights include it; a row that
        sees no key gets 0 and ``lse = sink_h``; dropout drops key weights only.

    Returns
    -------
    out : ndarray, shape (..., H, Lq, Dv), dtype of q
    weights : ndarray, shape (..., H, Lq, Lk)
        Only if ``return_weights``.
    lse : ndarray, shape (..., H, Lq), dtype of q (float32 for half inputs)
        Only if ``return_lse``; last of the tuple.

    Notes
    -----
    A query that sees no key gets output 0 (and weights 0), never NaN. Hidden keys and
    values are never read, so NaN or inf stored there cannot reach the output.

    Raises
    ------
    TypeError, ValueError
        Bad input, before any work is done; the message names the argument, the shapes
        seen and what was expected.  A score or mask function that Numba cannot compile,
        or of the wrong arity or return type, is a TypeError naming it; an exception
        raised inside one is a ValueError naming it, chained from the original.
    BackendUnavailableError
        (a ValueError) ``backend="cuda"`` where neither a GPU nor the simulator is usable.
    """
    backend = check_backend(backend)
    problem = prepare(
        q, k, v, causal=causal, mask=mask, key_lengths=key_lengths, scale=scale,
        dropout_p=dropout_p, seed=seed, return_weights=return_weights,
        score_mod=score_mod, mask_mod=mask_mod, sinks=sinks,
    )
    if not isinstance(return_lse, bool | np.bool_):
        raise TypeError(f"return_lse must be a bool; got {type(return_lse).__name__}")
    name = resolve(backend, problem)
    if problem.sinks is not None and name != "reference":  # the kernel, then the sinks
        out, weights, lse = entry_module(name, "forward").run(replace(problem, sinks=None),
                                                              return_lse=True)
        out, lse, weights = merge_sinks(out, lse, problem.sinks, 1, weights)
        result = (problem.restore(out),) + (
            (problem.restore(weights),) if return_weights else ())
        if return_lse:
            return result + (problem.restore(lse[..., None])[..., 0],)
        return result if return_weights else result[0]
    if return_lse:
        out, weights, lse = entry_module(name, "forward").run(problem, return_lse=True)
        lse = problem.restore(lse[..., None])[..., 0]  # (..., H, Lq)
        return (problem.restore(out),) + (
            (problem.restore(weights),) if return_weights else ()) + (lse,)
    out, weights = entry_module(name, "forward").run(problem)
    if return_weights:
        return problem.restore(out), problem.restore(weights)
    return problem.restore(out)


def prepare(q, k, v, *, causal=False, mask=None, key_lengths=None, scale=None,
            dropout_p=0.0, seed=None, return_weights=False, score_mod=None,
            mask_mod=None, sinks=None) -> AttentionProblem:
    """Validate the arguments of :func:`attention` and normalise them, without running it.

    For callers that need the problem a call describes (its shape, its visible pairs, its
    FLOPs) or want to validate once and time a backend many times.

    Parameters
    ----------
    q, k, v : ndarray
        As :func:`attention`.
    causal, mask, key_lengths, scale, dropout_p, seed, return_weights, score_mod, mask_mod
        As :func:`attention` (every keyword of it except ``backend`` and ``return_lse``).
    sinks : ndarray, shape (H,), optional
        As :func:`attention`.

    Returns
    -------
    AttentionProblem
        A frozen dataclass: q ``(B, H, Lq, D)``, k ``(B, Hkv, Lk, D)``, v ``(B, Hkv, Lk, Dv)``
        (contiguous, one dtype; leading batch dims folded into B), ``mask`` as given (bool or
        additive; ``additive_mask()`` and ``visibility_mask()`` give each form),
        ``key_lengths`` (int64, shape (B,)), ``causal_offset`` (query i sees keys
        j <= i + offset; None when not causal), ``scale``, ``dropout_p``, ``seed``,
        ``score_mod`` and ``mask_mod`` (:mod:`kernels.mods` objects, checked; or None).
        ``shape`` is ``(B, H, Hkv, Lq, Lk, D, Dv)``; ``visible()`` is the (B, H, Lq, Lk)
        bool visibility of every pair (an L x L array: for small problems).

    Raises
    ------
    TypeError, ValueError
        As :func:`attention`.

    Examples
    --------
    >>> import numpy as np, kernels
    >>> q = np.zeros((2, 4, 8, 16), np.float32)
    >>> p = kernels.prepare(q, q[:, :2], q[:, :2], causal="bottom-right")
    >>> p.shape, p.causal_offset
    ((2, 4, 2, 8, 8, 16, 16), 0)
    """
    problem = check_attention_args(
        q, k, v, causal=causal, mask=mask, key_lengths=key_lengths, scale=scale,
        dropout_p=dropout_p, seed=seed, return_weights=return_weights,
    )
    problem = check_mods(problem, score_mod=score_mod, mask_mod=mask_mod)
    if sinks is None:
        return problem
    return replace(problem, sinks=check_sinks(sinks, problem.shape[1], problem.dtype))


def plan(dtypes=("float32", "float64")) -> dict:
    """Choose the numba backend's tile-product path for this machine now, per dtype.

    Times the micro-kernel's candidate register blocks, then the fastest against the BLAS
    tiles, on one thread (CPU time), and stores the choice beside Numba's cache: later
    calls and processes use it without timing (~20-45 s on a cold cache, mostly compiling;
    well under a second once stored).

    Parameters
    ----------
    dtypes : sequence of dtype-like, default ("float32", "float64")

    Returns
    -------
    dict
        As :func:`attention_plan`.
    """
    from ..numba_cpu import planner  # imports Numba: only when asked

    return planner.plan_all(tuple(np.dtype(d) for d in dtypes))


def plan_needed(shape, dtype) -> bool:
    """Whether a numba call of this shape would plan first (see :func:`plan`).

    True where no choice is stored for ``dtype`` (here or beside Numba's cache) and the
    call's work, B·H·Lq·Lk·(D + Dv) multiply-adds, reaches the planning limit.  A harness
    that times such calls plans ahead (:func:`plan`), so that no timed call pays for it and
    one run does not mix the two tile paths.

    Parameters
    ----------
    shape : tuple of int
        ``(B, H, Lq, Lk, D, Dv)``.
    dtype : dtype-like

    Returns
    -------
    bool
    """
    from ..numba_cpu import planner  # imports Numba: only when asked

    return (planner.stored_choice(dtype) is None
            and multiply_adds(*shape) >= planner.PLAN_WORK_LIMIT)


def attention_plan() -> dict:
    """What the numba backend's tile products use here, per dtype, without planning.

    Returns
    -------
    dict
        ``{"float32": ..., "float64": ...}``, each the micro-kernel's register block
        (e.g. ``"8x16"``), ``"blas"``, or ``"not planned"`` (the BLAS path, until
        :func:`plan` or a large call plans).
    """
    from ..numba_cpu import planner  # imports Numba: only when asked

    return planner.record()


def compiled_forms() -> dict:
    """The forms the numba backend compiles on this machine, without compiling.

    Returns
    -------
    dict
        ``target``: the CPU Numba compiles for and its vector registers (e.g.
        ``"znver3: avx2, 16 x 256-bit vector registers"``); ``micro_blocks``: per dtype,
        the micro-kernel's register blocks the planner chooses among; ``bfloat16_products``:
        ``"vdpbf16ps"`` (AVX512-BF16) or ``"emulated"`` (two fused multiply-adds per
        pair of bfloat16).
    """
    from ..numba_cpu import planner  # imports Numba: only when asked

    return planner.forms()


def attention_backward(q, k, v, dout, *, out=None, lse=None, causal=False, mask=None,
                       key_lengths=None, scale=None, dropout_p=0.0, seed=None, backend="auto",
                       score_mod=None, mask_mod=None, sinks=None, deterministic=False):
    """Gradients of ``sum(dout * attention(q, k, v, ...))`` with respect to q, k and v.

    Parameters
    ----------
    q, k, v : ndarray
        As in :func:`kernels.attention`: (..., H, Lq, D), (..., Hkv, Lk, D),
        (..., Hkv, Lk, Dv), also 3-D and 2-D; float32, float64, float16 or bfloat16,
        one dtype (the gradients in that dtype, computed in float32 for half inputs).
    dout : ndarray, shape (..., H, Lq, Dv)
        Gradient of the loss with respect to attention's output, in q's dtype.
    out : ndarray, shape (..., H, Lq, Dv), optional
        The forward output for the same arguments (with the same dropout seed).
        Recomputed when missing.
    lse : ndarray, shape (..., H, Lq), optional
        The forward's log-sum-exp (``attention(..., return_lse=True)``). Recomputed when
        missing (with ``out``, by one forward call).
    causal, mask, key_lengths, scale, dropout_p, seed, backend
        As in :func:`kernels.attention`. Masks are constants: no gradient flows to them.
        With ``dropout_p > 0`` pass the forward's ``seed``: the same weights are dropped.
    score_mod, mask_mod : optional
        As in :func:`kernels.attention` (the same functions as the forward's).  The
        gradient flows through ``score_mod`` by its derivative with respect to the score:
        built-ins carry theirs; a user function needs one
        (``kernels.mods.score_mod(fn, *arrays, grad=dfn)``).
    sinks : ndarray, shape (H,), optional
        As in :func:`kernels.attention`; ``out`` and ``lse`` must then be the forward's
        with the same sinks.
    deterministic : bool, default False
        Split the numba backward's work by the problem alone, as ``deterministic`` of
        :func:`kernels.attention_with_kvcache` fixes the decode split size: the key blocks
        of fewer (batch, kv head) pairs than
        ``kernels.numba_cpu.config.BACKWARD_DETERMINISTIC_TASKS`` (8) are split into
        enough chunks for that many tasks, so dq's bits do not depend on the thread count
        (``False``: the chunks follow the thread count, two tasks per thread, and dq, the
        sum of the chunks' parts, changes bits with it; dk and dv do not).  The bits still
        depend on the number of (batch, kv head) pairs, i.e. on the batch.  The reference
        and cuda backends are deterministic already and ignore it: the cuda kernels give
        each dq row and each key's dk and dv to one GPU thread, which sums in a fixed
        order, without atomics.

    Returns
    -------
    dq : ndarray, shape of q
    dk : ndarray, shape of k
        Summed over the query heads that share each key/value head (GQA/MQA).
    dv : ndarray, shape of v
    dsinks : ndarray, shape (H,)
        Only when ``sinks`` are given: ``-Σ`` over batch and rows of
        ``p_sink · rowsum(dout ∘ out)``, in q's dtype.

    Notes
    -----
    A query that sees no key gets ``dq = 0`` and adds nothing to ``dk`` and ``dv``; keys
    no query sees get ``dk = dv = 0``.  NaN or inf stored in a hidden key or value, or in
    the q and dout rows of a query that sees no key, reaches no gradient.  ``out`` and
    ``lse`` are trusted to be the forward's (the numba and cuda backends recompute the
    softmax from ``lse`` and take ``rowsum(dout * out)`` from ``out``); the reference
    backend recomputes both in float64 and ignores them.

    Raises
    ------
    TypeError, ValueError
        As :func:`kernels.attention`; also a ``dout``, ``out`` or ``lse`` of the wrong
        shape or dtype (the message names the argument), a ``deterministic`` that is not a
        bool (TypeError), and a user ``score_mod`` without a derivative (ValueError naming
        the function).

    Examples
    --------
    >>> import numpy as np, kernels
    >>> q = k = v = np.ones((1, 2, 4, 8), np.float32)
    >>> out, lse = kernels.attention(q, k, v, causal=True, return_lse=True)
    >>> dq, dk, dv = kernels.attention_backward(q, k, v, np.ones_like(out), out=out,
    ...                                         lse=lse, causal=True)
    >>> dq.shape, dk.shape, dv.shape
    ((1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8))
    """
    backend = check_backend(backend)
    deterministic = check_deterministic(deterministic)
    problem = check_attention_args(
        q, k, v, causal=causal, mask=mask, key_lengths=key_lengths, scale=scale,
        dropout_p=dropout_p, seed=seed,
    )
    problem = check_mods(problem, score_mod=score_mod, mask_mod=mask_mod)
    problem = replace(problem, deterministic=deterministic)
    if problem.score_mod is not None:
        problem.score_mod.grad("cpu", compute_dtype(problem.dtype))  # ValueError if it has none
    sinks = check_sinks(sinks, problem.shape[1], problem.dtype)
    q_shape = np.shape(q)
    dout, out, lse = check_backward_args(problem, q_shape, dout, out, lse)
    name = resolve(backend, problem, "backward")
    if sinks is not None and name == "reference":
        dq, dk, dv, dsinks = entry_module(name, "backward").run(replace(problem, sinks=sinks),
                                                                dout)
    else:
        if name != "reference" and (out is None or lse is None):
            out, _, lse = entry_module(name, "forward").run(problem, return_lse=True)
            if sinks is not None:
                out, lse, _ = merge_sinks(out, lse, sinks, 1)
        kernel_lse = lse if sinks is None else keys_only_lse(lse, sinks, 1)
        dq, dk, dv = entry_module(name, "backward").run(problem, dout, out, kernel_lse)
        if sinks is not None:
            dsinks = sink_gradient(dout, out, lse, sinks, 1)
    k_lead = np.shape(k)[:-1]  # dk and dv take k's and v's shapes (any rank)
    grads = (problem.restore(dq), dk.reshape(k_lead + dk.shape[-1:]),
             dv.reshape(k_lead + dv.shape[-1:]))
    return grads if sinks is None else grads + (dsinks,)
