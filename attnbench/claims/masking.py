"""Checks of the claims about masks and dropout: C07 (causal), C08 (padding), C25 (a −1e9
float mask), C26 (dropout), C31 (−∞ and the softmax).

They run :func:`kernels.attention` (the fused ``numba`` backend, and the ``reference``
where the claim is about the formula).  Each ``cNN()`` returns a
:class:`attnbench.claims.rules.Result` decided by the rule in its docstring.
"""

from __future__ import annotations

import numpy as np

from attnbench import kernels
from attnbench.claims.attention import randn
from attnbench.claims.rules import CAVEAT, FAILS, HOLDS, Result


def c07() -> Result:
    """Rule: with causal=True (numba and reference, float32), every weight above the
    diagonal must be exactly 0, and overwriting the keys and values of positions ≥ t with
    1e30, NaN and inf must leave the outputs of rows < t bit-identical.  holds if both."""
    rng = np.random.default_rng(12)
    L, D = 40, 16
    q, k, v = (randn(rng, 1, 2, L, D) for _ in range(3))
    zeros_ok, identical = True, True
    for backend in ("numba", "reference"):
        out, w = kernels.attention(q, k, v, causal=True, return_weights=True, backend=backend)
        zeros_ok &= bool((w[..., np.triu_indices(L, 1)[0], np.triu_indices(L, 1)[1]] == 0).all())
        for t, garbage in ((25, 1e30), (10, np.nan), (33, np.inf)):
            k2, v2 = k.copy(), v.copy()
            k2[..., t:, :] = garbage
            v2[..., t:, :] = garbage
            out2 = kernels.attention(q, k2, v2, causal=True, backend=backend)
            identical &= bool(np.array_equal(out[..., :t, :], out2[..., :t, :]))
    measured = (f"L={L}: weights above the diagonal exactly 0: {zeros_ok}; outputs before "
                f"position t bit-identical when future keys/values become 1e30, NaN or inf: "
                f"{identical} (numba and reference)")
    values = {"future_weights_zero": zeros_ok, "earlier_outputs_unchanged": identical}
    return Result(HOLDS if zeros_ok and identical else FAILS, measured, values=values)


def c08() -> Result:
    """Rule: padding given as key_lengths and as a boolean mask; overwriting the PAD keys and
    values with NaN/inf must leave every non-PAD query's output bit-identical, with PAD
    weights exactly 0.  holds if both, for numba and reference."""
    rng = np.random.default_rng(13)
    B, H, L, D = 2, 2, 24, 8
    lengths = np.array([17, 9])
    q, k, v = (randn(rng, B, H, L, D) for _ in range(3))
    mask = (np.arange(L)[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, L)
    ok_weights, ok_outputs = True, True
    for backend in ("numba", "reference"):
        for kwargs in ({"key_lengths": lengths}, {"mask": mask}):
            out, w = kernels.attention(q, k, v, return_weights=True, backend=backend, **kwargs)
            k2, v2 = k.copy(), v.copy()
            for b, n in enumerate(lengths):
                k2[b, :, n:] = np.nan
                v2[b, :, n:] = np.inf
                ok_weights &= bool((w[b, :, :, n:] == 0).all())
            out2 = kernels.attention(q, k2, v2, backend=backend, **kwargs)
            for b, n in enumerate(lengths):
                ok_outputs &= bool(np.array_equal(out[b, :, :n], out2[b, :, :n]))
    measured = (f"key lengths {lengths.tolist()} of {L}, as key_lengths and as a bool mask: "
                f"PAD weights exactly 0: {ok_weights}; real tokens' outputs bit-identical "
                f"with NaN/inf in PAD keys/values: {ok_outputs}")
    return Result(HOLDS if ok_weights and ok_outputs else FAILS, measured,
                  values={"pad_weights_zero": ok_weights, "outputs_unchanged": ok_outputs},
                  details="PAD queries still get outputs (attending to real tokens); they are "
                          "discarded downstream, and every layer must apply the mask.")


def c25() -> Result:
    """Rule: adding −1e9 to PAD scores (float mask, float32 and float64, numba and reference)
    must give PAD weights of exactly 0 — "practically 0" — in rows that have a real key.  A
    row where every key is PAD gets measured too; if its weights are not 0 (uniform 1/L
    instead), holds-with-caveat.  Also recorded: −1e9 in float16 is −inf."""
    rng = np.random.default_rng(20)
    L = 8
    worst = 0.0
    for dtype in (np.float32, np.float64):
        q = randn(rng, 1, 1, L, 16, dtype=dtype)
        mask = np.zeros((L, L), dtype)
        mask[:, 5:] = -1e9
        for backend in ("numba", "reference"):
            _, w = kernels.attention(q, q, q, mask=mask, return_weights=True, backend=backend)
            worst = max(worst, float(np.abs(w[..., 5:]).max()))
    q = randn(rng, 1, 1, L, 16)
    _, w_all = kernels.attention(q, q, q, mask=np.full((L, L), -1e9, np.float32),
                                 return_weights=True)
    all_pad = float(w_all.max())
    with np.errstate(over="ignore"):
        fp16 = float(np.float16(-1e9))
    values = {"max_pad_weight": worst, "all_pad_row_weight": all_pad, "float16_value": fp16}
    measured = (f"PAD weights with −1e9 added: max {worst:g} (float32 and float64); a row "
                f"with every key PAD: each weight {all_pad:.3f} = 1/{L}; float16(−1e9) = {fp16}")
    if worst != 0:
        return Result(FAILS, measured, values=values)
    if all_pad != 0:
        return Result(CAVEAT, measured, values=values,
                      condition=f"for rows with at least one real key; a row of only PAD keys "
                                f"gets uniform weights 1/L over them ({all_pad:.3f} here), "
                                "unlike −∞/boolean masks (0 in kernels)",
                      details="−1e9 is exactly 0 after exp in float32/64 (exp(−1e9) "
                              "underflows); in float16 −1e9 is −inf.")
    return Result(HOLDS, measured, values=values)


def c26() -> Result:
    """Rule: with V = the identity, kernels.attention's output is the weight matrix after
    dropout, so dropped links are visible.  holds if, for p = 0.1 (numba), the dropped
    fraction of links is within 5 standard errors of p, kept weights are scaled by exactly
    1/(1 − p) (rtol 1e-5), two seeds drop different links, and p = 0 drops none."""
    rng = np.random.default_rng(21)
    L, p = 256, 0.1
    q = randn(rng, 1, 1, L, 32)
    eye = np.eye(L, dtype=np.float32)[None, None]  # V = I: output = weights after dropout
    _, w = kernels.attention(q, q, eye, return_weights=True)
    after = [kernels.attention(q, q, eye, dropout_p=p, seed=s, backend="numba") for s in (1, 2)]
    kept = after[0] != 0
    dropped = float(1 - kept.mean())
    sigma = float(np.sqrt(p * (1 - p) / kept.size))
    scale_ok = bool(np.allclose(after[0][kept], w[kept] / (1 - p), rtol=1e-5))
    differ = float(((after[0] != 0) != (after[1] != 0)).mean())
    inference_same = bool(np.allclose(kernels.attention(q, q, eye, dropout_p=0.0), w))
    sums = after[0].sum(axis=-1)
    ok = abs(dropped - p) <= 5 * sigma and scale_ok and differ > 0 and inference_same
    values = {"dropped_fraction": dropped, "sigma": sigma, "kept_scaled_by_1_over_1_minus_p":
              scale_ok, "seeds_differ_fraction": differ, "row_sum_range":
              [float(sums.min()), float(sums.max())]}
    measured = (f"p = {p}: {dropped:.4f} of {kept.size:,} links dropped (±{sigma:.4f}), kept "
                f"ones ×1/(1−p): {scale_ok}; two seeds differ on {differ:.1%} of links; rows "
                f"then sum to {sums.min():.2f}–{sums.max():.2f} (1 on average)")
    return Result(HOLDS if ok else FAILS, measured, values=values,
                  details="Inverted dropout: rows no longer sum to 1 during training; p = 0 "
                          "(inference) changes nothing.")


def c31() -> Result:
    """Rule: holds-with-caveat or holds requires np.exp(float32(−inf)) == 0 and masked
    weights exactly 0 through kernels.attention (float32, −inf float mask and bool mask,
    numba and reference).  A row whose every key is masked is measured through a plain
    softmax (NaN: −inf − (−inf)) and kernels (0); NaN there makes it holds-with-caveat."""
    exp_zero = bool(np.exp(np.float32(-np.inf)) == 0)
    rng = np.random.default_rng(23)
    L = 12
    q = randn(rng, 1, 2, L, 16)
    bool_mask = rng.random((L, L)) < 0.6
    np.fill_diagonal(bool_mask, True)
    float_mask = np.where(bool_mask, 0, -np.inf).astype(np.float32)
    exact = True
    for backend in ("numba", "reference"):
        for mask in (bool_mask, float_mask):
            _, w = kernels.attention(q, q, q, mask=mask, return_weights=True, backend=backend)
            exact &= bool((w[..., ~bool_mask] == 0).all())
    row = np.full(4, -np.inf, np.float32)
    with np.errstate(invalid="ignore"):
        plain = np.exp(row - row.max()) / np.exp(row - row.max()).sum()
    plain_nan = bool(np.isnan(plain).all())
    kernels_row = kernels.softmax(row)
    values = {"exp_neg_inf_float32": exp_zero, "masked_weights_exactly_zero": exact,
              "plain_softmax_all_masked_nan": plain_nan,
              "kernels_all_masked": kernels_row.tolist()}
    measured = (f"exp(float32 −inf) = {float(np.exp(np.float32(-np.inf)))}; masked weights "
                f"exactly 0 (float32, bool and −inf masks, numba and reference): {exact}; a "
                f"row with every key masked: plain max-subtracted softmax gives "
                f"{'NaN' if plain_nan else plain.tolist()}, kernels.softmax "
                f"{kernels_row.tolist()}")
    if not (exp_zero and exact):
        return Result(FAILS, measured, values=values)
    if plain_nan:
        return Result(CAVEAT, measured, values=values,
                      condition="as long as the row has at least one unmasked key; with every "
                                "key masked a plain softmax computes −∞ − (−∞) = NaN "
                                "(kernels returns 0 by convention)")
    return Result(HOLDS, measured, values=values)
