"""Checks of the claims about softmax itself: C01–C03, C06, C14–C16, C21, C23.

Each ``cNN()`` computes what its claim is about and returns a
:class:`attnbench.claims.rules.Result` whose verdict follows from the numbers by the rule in
the function's docstring.  Everything is seeded and deterministic.
"""

from __future__ import annotations

import numpy as np

from attnbench import kernels
from attnbench.claims.rules import CAVEAT, FAILS, HOLDS, Result, rounds_to
from attnbench.studies import stability, stability_gradients

#: The sources' example scores (article 004) and the weights it says softmax gives.
EXAMPLE_SCORES = (0.9, 0.1, 0.3)
STATED_WEIGHTS = (0.73, 0.05, 0.22)


def _first_true(predicate, lo: float, hi: float, steps: int = 200) -> float:
    """Smallest x in [lo, hi] with ``predicate(x)`` true, by bisection (predicate monotone)."""
    for _ in range(steps):
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            break
        lo, hi = (lo, mid) if predicate(mid) else (mid, hi)
    return hi


def c01() -> Result:
    """Rule: in float64 with moderate logits all weights must lie in (0, 1) with row sums
    within 4·n·eps of 1 (else does-not-hold).  Then the float extremes are measured: the
    logit gap below the maximum at which a weight becomes exactly 0, whether the top weight
    becomes exactly 1, and how many float32 row sums are exactly 1.  Any of these makes the
    verdict holds-with-caveat (true in exact arithmetic only)."""
    rng = np.random.default_rng(1)
    x = 3 * rng.standard_normal((2000, 16))  # moderate logits
    p64 = kernels.softmax(x)
    n = x.shape[1]
    in_open = bool(((p64 > 0) & (p64 < 1)).all())
    sum_err64 = float(np.abs(p64.sum(axis=1) - 1).max())
    p32 = kernels.softmax(x.astype(np.float32))
    sums32 = p32.sum(axis=1, dtype=np.float32)
    exact32 = float((sums32 == 1).mean())
    ulps32 = float(np.abs(sums32.astype(np.float64) - 1).max() / np.finfo(np.float32).eps)

    def zero_gap(dtype):  # gap g at which softmax([0, -g]) gives an exact 0
        return _first_true(lambda g: kernels.softmax(np.array([0, -g], dtype))[1] == 0, 1, 2000)

    gap32, gap64 = zero_gap(np.float32), zero_gap(np.float64)
    one32 = _first_true(lambda g: kernels.softmax(np.array([0, -g], np.float32))[0] == 1, 1, 200)
    ok = in_open and sum_err64 <= 4 * n * np.finfo(np.float64).eps
    values = {"float64_all_in_open_interval": in_open, "float64_max_sum_error": sum_err64,
              "float32_sums_exactly_1_fraction": exact32, "float32_max_sum_error_ulps": ulps32,
              "float32_zero_gap": gap32, "float64_zero_gap": gap64,
              "float32_top_weight_is_1_gap": one32}
    measured = (f"float64, 2000 rows of 16: all in (0,1), max |Σ−1| = {sum_err64:.1e}; "
                f"float32: {exact32:.0%} of row sums exactly 1 (max error {ulps32:.1f} ulp); "
                f"a weight is exactly 0 once its logit is {gap32:.2f} (float32) / "
                f"{gap64:.2f} (float64) below the max; the top weight rounds to exactly 1.0 "
                f"from a gap of {one32:.2f} (float32)")
    if not ok:
        return Result(FAILS, measured, values=values)
    extremes = gap32 < 2000 or one32 < 200 or exact32 < 1
    if not extremes:
        return Result(HOLDS, measured, values=values)
    return Result(
        CAVEAT, measured,
        condition=(f"in exact arithmetic; in floating point weights reach exactly 0 (logit "
                   f"≥ {gap32:.2f} below the max in float32, {gap64:.2f} in float64) and "
                   f"exactly 1, and sums equal 1 only to rounding ({ulps32:.0f} ulp)"),
        details="kernels.softmax (max-subtracted); gaps found by bisection on softmax([0, −g]).",
        values=values)


def c02() -> Result:
    """Rule: holds if the entropy of softmax(x/T) never decreases as T grows (1e-12
    tolerance) for every studied logit vector, and it spans from low (max weight ≥ 0.9 at the
    smallest T, for vectors with a unique maximum) to near log n (≥ 0.99 log n at the
    largest T); does-not-hold otherwise."""
    study = stability.temperature_study()
    monotone = study.groupby("logits", sort=False)["monotone"].first()
    ends = study.groupby("logits", sort=False).agg(
        low_T_max=("max_weight", "first"), high_T_entropy=("entropy_fraction", "last"))
    unique_max = [name for name in ends.index if not name.startswith("tie")]
    peaked = bool((ends.loc[unique_max, "low_T_max"] >= 0.9).all())
    uniform = bool((ends["high_T_entropy"] >= 0.99).all())
    T = study["T"]
    measured = (f"{len(monotone)} logit vectors, T from {T.min():g} to {T.max():g}: entropy "
                f"monotone in {int(monotone.sum())}/{len(monotone)}; max weight at the "
                f"smallest T {ends['low_T_max'].min():.3f}–{ends['low_T_max'].max():.3f}; "
                f"entropy at the largest T ≥ {ends['high_T_entropy'].min():.3f}·log n")
    values = {"monotone": {k: bool(v) for k, v in monotone.items()}, "peaked_at_low_T": peaked,
              "uniform_at_high_T": uniform}
    verdict = HOLDS if monotone.all() and peaked and uniform else FAILS
    return Result(verdict, measured, values=values,
                  details="kernels.softmax(x, temperature=T) on a log grid of 61 T; with a "
                          "tie at the top the low-T limit splits the weight over the tie.")


def c03() -> Result:
    """Rule: the quoted numbers must round to the computed ones (e^10 − e^9 ≈ 12,000 to the
    thousand, e^2 − e^1 ≈ 4.7 to 0.1) and the ratio must exceed 2,500.  Also measured: the
    ratio of the softmax output differences inside one softmax over [10, 9, 2, 1], and
    across two separate softmaxes of [10, 9] and [2, 1] (softmax is shift-invariant).
    holds if all agree; holds-with-caveat if the ratio claim holds but a quoted number or
    the two-softmax reading does not; does-not-hold if the ratio does not exceed 2,500."""
    big, small = float(np.exp(10) - np.exp(9)), float(np.exp(2) - np.exp(1))
    ratio = big / small
    p = kernels.softmax(np.array([10.0, 9.0, 2.0, 1.0]))
    inside = float((p[0] - p[1]) / (p[2] - p[3]))
    pa, pb = kernels.softmax(np.array([10.0, 9.0])), kernels.softmax(np.array([2.0, 1.0]))
    across = float((pa[0] - pa[1]) / (pb[0] - pb[1]))
    big_ok, small_ok = rounds_to(big, 12_000, 1_000), rounds_to(small, 4.7, 0.1)
    values = {"exp10_minus_exp9": big, "exp2_minus_exp1": small, "ratio": ratio,
              "softmax_ratio_same_vector": inside, "softmax_ratio_separate_vectors": across,
              "stated_12000_matches": big_ok, "stated_4_7_matches": small_ok}
    measured = (f"e^10 − e^9 = {big:,.0f} (stated ≈12,000: {'ok' if big_ok else 'off'}), "
                f"e^2 − e^1 = {small:.2f} (stated ≈4.7: {'ok' if small_ok else 'off'}), "
                f"ratio {ratio:,.0f} = e^8; softmax output differences: ratio {inside:,.0f} "
                f"inside one softmax of [10, 9, 2, 1], {across:.3f} across softmax([10, 9]) "
                f"and softmax([2, 1])")
    if ratio <= 2500:
        return Result(FAILS, measured, values=values)
    problems = []
    if not big_ok:
        problems.append(f"e^10 − e^9 is {big:,.0f}, not ≈12,000 ({big / 12_000 - 1:+.0%})")
    if not small_ok:
        problems.append(f"e^2 − e^1 is {small:.2f}, not ≈4.7")
    if abs(across - 1) < 1e-9:
        problems.append("the 2,981× holds for logits inside one softmax only: shifting all "
                        "logits changes nothing, so softmax([10, 9]) = softmax([2, 1])")
    if not problems:
        return Result(HOLDS, measured, values=values)
    return Result(CAVEAT, measured, condition="; ".join(problems), values=values,
                  details="The ratio of exp differences is e^8 exactly; the same ratio "
                          "appears between output differences inside one softmax.")


def c06() -> Result:
    """Rule (from :func:`attnbench.studies.stability.scaling_study`, q and k with independent
    unit-variance entries): the log-log slope of the unscaled logit variance against d_k
    must be within 0.1 of 1; the scaled variance within 20 % of 1 at every d_k; and
    saturation must separate the two: the unscaled largest weight rises with d_k while the
    scaled one stays below 0.2 and no scaled row is nearly one-hot.  holds if all,
    does-not-hold otherwise."""
    from attnbench.claims.rules import loglog_slope

    study = stability.scaling_study()
    raw = study[~study["scaled"]].sort_values("d_k")
    scaled = study[study["scaled"]].sort_values("d_k")
    slope, ci = loglog_slope(raw["d_k"], raw["logit_var"])
    var_ok = abs(slope - 1) <= 0.1 and bool(np.allclose(scaled["logit_var"], 1, rtol=0.2))
    rising = bool((np.diff(raw["max_weight_mean"]) > 0).all())
    calm = bool(scaled["max_weight_mean"].max() < 0.2 and scaled["one_hot_fraction"].max() == 0)
    values = {"variance_slope": slope, "variance_slope_ci": ci,
              "scaled_variance_range": [float(scaled["logit_var"].min()),
                                        float(scaled["logit_var"].max())],
              "unscaled_max_weight": raw["max_weight_mean"].round(4).tolist(),
              "scaled_max_weight": scaled["max_weight_mean"].round(4).tolist()}
    lo, hi = int(raw["d_k"].min()), int(raw["d_k"].max())
    measured = (f"var(q·k) ∝ d_k^{slope:.3f}±{ci:.3f} (d_k {lo}–{hi}); scaled variance "
                f"{scaled['logit_var'].min():.2f}–{scaled['logit_var'].max():.2f}; mean "
                f"largest weight unscaled {raw['max_weight_mean'].iloc[0]:.2f} → "
                f"{raw['max_weight_mean'].iloc[-1]:.2f}, scaled "
                f"{scaled['max_weight_mean'].min():.2f}–{scaled['max_weight_mean'].max():.2f}")
    verdict = HOLDS if var_ok and rising and calm else FAILS
    return Result(verdict, measured, values=values,
                  details=f"q, k ~ N(0, 1) entries, {int(raw['L'].iloc[0])} keys per row, "
                          "256 rows per d_k; the variance argument assumes independent "
                          "unit-variance entries, as at initialisation.")


def c14() -> Result:
    """Rule: the claim holds mathematically if random vectors give cosines in [−1, 1], x with
    itself gives 1, x with −x gives −1 and orthogonal vectors 0 (to 1e-12).  If, computed in
    floating point as x·y/(‖x‖‖y‖), some cosine falls outside [−1, 1], holds-with-caveat
    (np.arccos of it is NaN)."""
    rng = np.random.default_rng(2)
    results = {}
    for dtype in (np.float64, np.float32):
        x = rng.standard_normal((20000, 64)).astype(dtype)
        y = rng.standard_normal((20000, 64)).astype(dtype)
        norm = np.linalg.norm(x, axis=1)
        self_cos = np.einsum("ij,ij->i", x, x) / (norm * norm)
        cross = np.einsum("ij,ij->i", x, y) / (norm * np.linalg.norm(y, axis=1))
        eps = np.finfo(dtype).eps
        results[np.dtype(dtype).name] = {
            "self_cos_above_1_fraction": float((self_cos > 1).mean()),
            "max_excess_ulps": float((np.abs(np.concatenate([self_cos, cross])).max() - 1) / eps),
            "cross_in_range": bool((np.abs(cross) <= 1).all()),
        }
    e1, e2 = np.eye(2)
    opposite = float(e1 @ -e1 / (np.linalg.norm(e1) ** 2))
    orthogonal = float(e1 @ e2)
    math_ok = opposite == -1 and orthogonal == 0 and all(r["cross_in_range"]
                                                          for r in results.values())
    f32, f64 = results["float32"], results["float64"]
    measured = (f"cos(x, −x) = {opposite:g}, orthogonal: {orthogonal:g}; random pairs in "
                f"[−1, 1]; cos(x, x) computed as x·x/(‖x‖‖x‖) exceeds 1 in "
                f"{f64['self_cos_above_1_fraction']:.0%} of 20,000 float64 vectors "
                f"(by ≤ {f64['max_excess_ulps']:.0f} ulp) and "
                f"{f32['self_cos_above_1_fraction']:.0%} in float32 (≤ "
                f"{f32['max_excess_ulps']:.0f} ulp)")
    values = {"opposite": opposite, "orthogonal": orthogonal, **results}
    if not math_ok:
        return Result(FAILS, measured, values=values)
    if f64["self_cos_above_1_fraction"] or f32["self_cos_above_1_fraction"]:
        return Result(CAVEAT, measured, values=values,
                      condition="in exact arithmetic; computed cosines can exceed 1 by a "
                                "few ulps (clip before arccos)",
                      details="\"0 = unrelated\" is an interpretation: 0 means orthogonal.")
    return Result(HOLDS, measured, values=values)


def c15() -> Result:
    """Rule (scaling study, L = 128 keys, and real gradients through
    :func:`kernels.attention_backward`, :mod:`attnbench.studies.stability_gradients`):
    "nearly one-hot" is a row whose largest weight exceeds 0.99; the gradient is the row
    norm of dQ measured with and without the 1/√d_k scale.  does-not-hold if unscaled rows
    do not saturate at the largest d_k (most rows one-hot, none scaled), or if there the
    median unscaled ‖dQ‖ row is not below the scaled one.  holds if moreover the median
    unscaled ‖dQ‖ is below the scaled one at every d_k and most unscaled rows vanish
    (below 1% of the scaled median) at the largest; holds-with-caveat otherwise, with the
    d_k from which the median falls below the scaled one and what does not shrink."""
    study = stability.scaling_study()
    raw = study[~study["scaled"]].set_index("d_k").sort_index()
    scaled = study[study["scaled"]].set_index("d_k").sort_index()
    grads = stability_gradients.gradient_study(stability.D_K_VALUES)
    graw = grads[~grads["scaled"]].set_index("d_k").sort_index()
    gscaled = grads[grads["scaled"]].set_index("d_k").sort_index()
    top = raw.index.max()
    saturates = raw.loc[top, "one_hot_fraction"] > 0.5 and scaled["one_hot_fraction"].max() == 0
    below = graw["dq_norm_median"] < gscaled["dq_norm_median"]
    majority = raw.index[raw["one_hot_fraction"] > 0.5]
    onset = int(majority.min()) if len(majority) else None
    shrink_from = None  # the smallest d_k from which the median stays below the scaled one
    for d_k in reversed(below.index):
        if not below[d_k]:
            break
        shrink_from = int(d_k)
    values = {"onset_d_k": onset, "shrinks_from_d_k": shrink_from,
              "unscaled_one_hot": raw["one_hot_fraction"].round(4).to_dict(),
              "unscaled_dq_median": graw["dq_norm_median"].round(4).to_dict(),
              "scaled_dq_median": gscaled["dq_norm_median"].round(4).to_dict(),
              "unscaled_dq_mean": graw["dq_norm_mean"].round(4).to_dict(),
              "unscaled_dk_median": graw["dk_norm_median"].round(4).to_dict(),
              "scaled_dk_median": gscaled["dk_norm_median"].round(4).to_dict(),
              "unscaled_dq_vanishing": graw["dq_vanishing_fraction"].round(4).to_dict(),
              "unscaled_jacobian_mean": raw["jacobian_fro_mean"].round(4).to_dict()}
    measured = (f"d_k = {top}: {raw.loc[top, 'one_hot_fraction']:.0%} of unscaled rows nearly "
                f"one-hot (scaled 0%); median ‖dQ‖ row {graw.loc[top, 'dq_norm_median']:.3g} "
                f"unscaled vs {gscaled.loc[top, 'dq_norm_median']:.3g} scaled, "
                f"{graw.loc[top, 'dq_vanishing_fraction']:.0%} of unscaled rows below 1% of "
                f"the scaled median; mean ‖dQ‖ {graw.loc[top, 'dq_norm_mean']:.3g} vs "
                f"{gscaled.loc[top, 'dq_norm_mean']:.3g}; median ‖dK‖ "
                f"{graw.loc[top, 'dk_norm_median']:.3g} vs "
                f"{gscaled.loc[top, 'dk_norm_median']:.3g}")
    if not (saturates and below[top]):
        return Result(FAILS, measured, values=values)
    if below.all() and graw.loc[top, "dq_vanishing_fraction"] > 0.5:
        return Result(HOLDS, measured, values=values)
    condition = (f"for large d_k: most rows saturate from d_k = {onset} and the median query "
                 f"gradient falls below the scaled one from d_k = {shrink_from} (L = "
                 f"{int(raw['L'].iloc[0])} keys, unit-variance q, k)")
    if graw.loc[top, "dq_vanishing_fraction"] <= 0.5:
        condition += (f"; at d_k = {top} only {graw.loc[top, 'dq_vanishing_fraction']:.0%} "
                      "of rows have vanishing gradients")
    if (graw["dq_norm_mean"] > gscaled["dq_norm_mean"]).all():
        condition += ("; the mean ‖dQ‖ stays larger unscaled at every d_k (no 1/√d_k factor, "
                      "and rows not yet saturated get large gradients)")
    if graw.loc[top, "dk_norm_median"] > gscaled.loc[top, "dk_norm_median"]:
        condition += "; ‖dK‖ does not shrink"
    return Result(CAVEAT, measured, condition=condition, values=values,
                  details="Gradients measured through kernels.attention_backward (numba "
                          "backend, float64), per query row. They vanish row by row as rows "
                          "saturate, not uniformly.")


def c16() -> Result:
    """Rule: contrast is measured by entropy (lower = more contrast).  Plain normalisation
    s/Σs does not change when all scores are multiplied by c > 0; softmax(c·s) does.  For
    the sources' scores [0.9, 0.1, 0.3] and a random positive score vector, find c* where
    softmax's entropy falls below plain normalisation's.  holds if softmax is sharper at
    c = 1 for every vector; holds-with-caveat if only above some c*; does-not-hold if never
    (c up to 1000).  Also recorded: plain normalisation is undefined for scores summing to 0."""
    rng = np.random.default_rng(3)
    vectors = {"[0.9, 0.1, 0.3]": np.array(EXAMPLE_SCORES), "random U(0,1), n=8": rng.random(8)}
    rows = {}
    for name, s in vectors.items():
        plain = s / s.sum()
        h_plain = float(stability.row_entropy(plain))

        def sharper(c, s=s, h_plain=h_plain):
            return float(stability.row_entropy(kernels.softmax(c * s))) < h_plain

        c_star = _first_true(sharper, 1e-3, 1000.0) if sharper(1000.0) else float("inf")
        rows[name] = {"plain": plain.round(3).tolist(),
                      "softmax": kernels.softmax(s).round(3).tolist(),
                      "sharper_at_1": sharper(1.0), "c_star": c_star}
    with np.errstate(divide="ignore", invalid="ignore"):
        zero_sum = np.array([0.5, -0.5]) / np.array([0.5, -0.5]).sum()
    values = {**rows, "plain_on_zero_sum": zero_sum.tolist()}
    ex = rows["[0.9, 0.1, 0.3]"]
    measured = (f"[0.9, 0.1, 0.3]: plain {ex['plain']}, softmax {ex['softmax']} (flatter); "
                f"softmax(c·s) is sharper than s/Σs only for c > {ex['c_star']:.2f}; random "
                f"scores: c > {rows['random U(0,1), n=8']['c_star']:.2f}")
    if all(r["sharper_at_1"] for r in rows.values()):
        return Result(HOLDS, measured, values=values)
    if all(np.isfinite(r["c_star"]) for r in rows.values()):
        worst = max(r["c_star"] for r in rows.values())
        return Result(CAVEAT, measured, values=values,
                      condition=f"only when the scores are spread widely enough: for these "
                                f"scores after multiplying them by more than {worst:.1f}; "
                                "softmax depends on the scale of the scores, plain "
                                "normalisation does not",
                      details="Plain normalisation also breaks when scores can be negative "
                              f"(s = [0.5, −0.5] gives {zero_sum.tolist()}).")
    return Result(FAILS, measured, values=values)


def c21() -> Result:
    """Rule: holds if raw scores of random q, k (through kernels.attention's weights with
    scale=1 and the raw products) have negative entries and rows not summing to 1, while the
    softmaxed weights are all in [0, 1] with rows summing to 1 within 1e-6."""
    rng = np.random.default_rng(4)
    q = rng.standard_normal((1, 1, 64, 32)).astype(np.float32)
    k = rng.standard_normal((1, 1, 64, 32)).astype(np.float32)
    scores = (q @ k.swapaxes(-1, -2))[0, 0] / np.sqrt(32)
    _, weights = kernels.attention(q, k, k, return_weights=True, backend="numba")
    weights = weights[0, 0]
    negative = float((scores < 0).mean())
    sums = scores.sum(axis=1)
    probs_ok = bool(((weights >= 0) & (weights <= 1)).all()
                    and np.abs(weights.sum(axis=1) - 1).max() < 1e-6)
    measured = (f"scaled scores: {negative:.0%} negative, row sums from {sums.min():.1f} to "
                f"{sums.max():.1f}, values up to {np.abs(scores).max():.1f} in magnitude; "
                f"weights in [0, 1], rows sum to 1 (max error "
                f"{np.abs(weights.sum(axis=1) - 1).max():.1e})")
    values = {"negative_score_fraction": negative, "weights_are_probabilities": probs_ok}
    verdict = HOLDS if negative > 0 and not np.allclose(sums, 1) and probs_ok else FAILS
    return Result(verdict, measured, values=values)


def c23() -> Result:
    """Rule: the stated weights must be what softmax gives, to the quoted precision (each
    within 0.005).  Otherwise does-not-hold; the details say what the stated numbers are
    closer to (plain normalisation s/Σs, or softmax at some temperature)."""
    s = np.array(EXAMPLE_SCORES)
    computed = kernels.softmax(s)
    stated = np.array(STATED_WEIGHTS)
    match = all(rounds_to(c, t, 0.01) for c, t in zip(computed, stated, strict=True))
    plain = s / s.sum()
    temperatures = np.geomspace(0.05, 5, 2001)
    errors = [np.abs(kernels.softmax(s, temperature=float(T)) - stated).max()
              for T in temperatures]
    best = int(np.argmin(errors))
    values = {"computed": computed.round(4).tolist(), "stated": stated.tolist(),
              "max_abs_difference": float(np.abs(computed - stated).max()),
              "plain_normalisation": plain.round(4).tolist(),
              "best_temperature": float(temperatures[best]),
              "best_temperature_error": float(errors[best])}
    measured = (f"softmax([0.9, 0.1, 0.3]) = {computed.round(2).tolist()} (stated "
                f"{list(STATED_WEIGHTS)}; largest difference {values['max_abs_difference']:.2f})")
    if match:
        return Result(HOLDS, measured, values=values)
    return Result(FAILS, measured, values=values,
                  details=(f"plain normalisation s/Σs gives {plain.round(2).tolist()}, closer to "
                           f"the stated numbers; no temperature reproduces them (best T = "
                           f"{temperatures[best]:.2f}, still off by {errors[best]:.2f})."))
