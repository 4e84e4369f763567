"""Checks of the claims about sizes and costs: C09–C12, C18, C24, C27–C29.

Parameter claims use :mod:`attnbench.studies.params` (and real
:class:`kernels.MultiHeadAttention` arrays where they fit); FLOP claims use
:mod:`attnbench.measure.flops`; timing claims time :func:`kernels.attention` (auto backend: the
fused numba kernel) with calls interleaved in one run
(:func:`attnbench.claims.rules.interleaved_medians`).  Claims about *cost* (C12, C18, C27,
C29) are judged on single-threaded CPU time, which stays put on a busy shared machine
(there, wall-clock ratios of small calls swing by 2-3x); C29 also reports the
multi-threaded wall-clock ratio.  Each timing check separates measuring from judging:
``judge_cNN`` is a pure function of the measured numbers, so the rule can be tested with
injected measurements while the measurement itself varies with the machine.  Judges take
the measured *interval* (95%: a bootstrap over the samples) and decide only when the whole
interval is on one side of the claim's boundary (:func:`attnbench.claims.rules.side`);
otherwise the verdict is inconclusive, so that it does not flip from run to run.
"""

from __future__ import annotations

import numpy as np

from attnbench import kernels
from attnbench.claims.rules import (
    ABOUT_RELATIVE,
    CAVEAT,
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    Result,
    about,
    interleaved_medians,
    loglog_slope,
    ratio,
    rounds_to,
    side,
    widen,
)
from attnbench.kernels import multihead
from attnbench.measure.flops import attention_flops
from attnbench.measure.problems import load_average
from attnbench.measure.timing import peak_extra_memory
from attnbench.studies import params
from attnbench.studies.fits import fit_scaling
from attnbench.studies.scaling import lower_term
from attnbench.studies.scaling_verdicts import (
    CLASS_NAMES,
    TOLERANCE,
    exponent_text,
    lower_order_dominates,
)


def _randn(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def c09() -> Result:
    """Rule: holds if the GPT-3 175B configuration (Brown et al. 2020: d_model 12288, 96
    heads) gives 96 heads and per-head W_Q, W_K of shape (d_head, d_model) = (128, 12288)."""
    gpt3 = params.get_config("gpt3-175b")
    shape = (gpt3.d_head, gpt3.d_model)
    ok = gpt3.n_heads == 96 and shape == (128, 12288)
    measured = (f"GPT-3: {gpt3.n_heads} heads, d_head = {gpt3.d_model} / {gpt3.n_heads} = "
                f"{gpt3.d_head}: per-head W_Q, W_K are {shape[0]} × {shape[1]:,} "
                f"({shape[0] * shape[1]:,} parameters each)")
    return Result(HOLDS if ok else FAILS, measured,
                  values={"n_heads": gpt3.n_heads, "per_head_shape": list(shape)})


def c10() -> Result:
    """Rule: count per head (GPT-3 and the GQA LLaMA-2-70B): value-down (d_model × d_head,
    i.e. W_V's share) + value-up (d_head × d_model, W_O's share) against query + key.  holds
    if the ratio rounds to 1 (≈: within 0.5 %) for every configuration."""
    rows = {}
    for name in ("gpt3-175b", "llama2-70b", "bert-base"):
        c = params.get_config(name)
        kv_width = c.kv_heads * c.d_head
        query_key = c.d_model * c.d_model + c.d_model * kv_width  # W_Q + W_K (layer)
        value = c.d_model * kv_width + c.d_model * c.d_model  # W_V (down) + W_O (up)
        rows[name] = {"query_plus_key": query_key, "value_down_plus_up": value,
                      "ratio": value / query_key, "full_square_value": c.d_model**2}
    gpt3 = rows["gpt3-175b"]
    ok = all(abs(r["ratio"] - 1) <= 0.005 for r in rows.values())
    measured = (f"GPT-3 per layer: value-down + value-up {gpt3['value_down_plus_up']:,} vs "
                f"query + key {gpt3['query_plus_key']:,} (ratio {gpt3['ratio']:.3f}; per head "
                f"2·128·12,288 = {2 * 128 * 12288:,} each); LLaMA-2-70B (GQA) ratio "
                f"{rows['llama2-70b']['ratio']:.3f}, BERT-base {rows['bert-base']['ratio']:.3f}")
    return Result(HOLDS if ok else FAILS, measured, values=rows,
                  details="Counts W_O as the heads' value-up maps (3Blue1Brown's accounting); "
                          "a full d_model × d_model value map per head would be "
                          f"{gpt3['full_square_value']:,} parameters. Biases excluded.")


def c11() -> Result:
    """Rule: "about 1/3" matches an attention share within ±15 % of 1/3 (0.283–0.383).
    Shares of all parameters for every named configuration: holds if all match,
    holds-with-caveat if some do (the condition names which), does-not-hold if none."""
    table = params.parameter_table(cross_check=False).set_index("config")
    share = table["attention_share"]
    matching = [name for name, value in share.items() if about(value, 1 / 3)]
    values = {"attention_share": share.round(4).to_dict(),
              "attention_share_non_embedding":
                  table["attention_share_non_embedding"].round(4).to_dict()}
    measured = "attention share of all parameters: " + ", ".join(
        f"{name} {value:.1%}" for name, value in share.items())
    if len(matching) == len(share):
        return Result(HOLDS, measured, values=values)
    if not matching:
        return Result(FAILS, measured, values=values)
    others = [name for name in share.index if name not in matching]
    return Result(
        CAVEAT, measured, values=values,
        condition=(f"for {', '.join(matching)}; not for {', '.join(others)}: 1/3 is exact only "
                   "for the non-embedding parameters of a multi-head model with d_ff = "
                   "4·d_model (4d² attention vs 8d² MLP per layer); embeddings weigh in small "
                   "models, GQA and SwiGLU MLPs shrink it (LLaMA-2-70B: "
                   f"{table.loc['llama2-70b', 'attention_share_non_embedding']:.1%} of the "
                   "non-embedding parameters)"),
        details="Shares from attnbench.studies.params (see its table for what each group counts).")


#: Sequence lengths of the C12 timing fit: 7 near-geometric points over 16x; shape
#: (B, H, L, D) = (1, 1, L, 64).
C12_LENGTHS = (128, 208, 320, 512, 800, 1280, 2048)


def judge_c12(time_interval: tuple[float, float], flop_slope: float,
              leading_share: float = 1.0) -> tuple[str, str]:
    """Verdict on O(n²) from the measured exponents: does-not-hold if the FLOP count's slope
    is not 2 (to 1e-6); inconclusive if the fit's leading term is less than half of the
    largest point's time (``leading_share``: the overhead and the linear term dominate,
    as :func:`attnbench.studies.scaling_verdicts.verdict` rules); holds if the whole 95% interval
    of the time's exponent lies within 2 ± TOLERANCE (:mod:`attnbench.studies.scaling`);
    holds-with-caveat (quadratic in FLOPs only) if it lies wholly outside; inconclusive
    if it straddles.  Returns (verdict, condition)."""
    if abs(flop_slope - 2) > 1e-6:
        return FAILS, ""
    if lower_order_dominates(leading_share):
        return INCONCLUSIVE, ""
    low, high = time_interval
    where = side(low, high, 2 - TOLERANCE, 2 + TOLERANCE)
    if where == "inside":
        return HOLDS, ""
    if where == "outside":
        return CAVEAT, (f"in FLOPs (exact slope 2); the measured time grew as L^[{low:.2f}, "
                        f"{high:.2f}] over these L on this machine")
    return INCONCLUSIVE, ""


def c12() -> Result:
    """Rule: :func:`judge_c12` on the exponent of the cost (kernels.attention, single-thread
    CPU time, interleaved, fitted as c + b·L + a·L^p with a bootstrap interval over the
    samples,
    :func:`attnbench.studies.fits.fit_scaling`) and of the exact FLOPs against L over
    :data:`C12_LENGTHS`.  Memory is measured alongside (tracemalloc peak; reference vs the
    fused kernel) and reported in the measured text."""
    rng = np.random.default_rng(30)
    inputs = {L: [_randn(rng, 1, 1, L, 64) for _ in range(3)] for L in C12_LENGTHS}
    times = interleaved_medians(
        {L: (lambda qkv=qkv: kernels.attention(*qkv)) for L, qkv in inputs.items()},
        rounds=3, max_time=0.03, cpu=True)
    medians = [times[L]["median"] for L in C12_LENGTHS]
    fit = fit_scaling(C12_LENGTHS, [times[L]["timing"].samples for L in C12_LENGTHS],
                      lower=lower_term("cpu", 2))
    flops = [attention_flops(1, 1, L, L, 64) for L in C12_LENGTHS]
    flop_slope, _ = loglog_slope(C12_LENGTHS, flops)
    memory = {}
    for backend in ("reference", "numba"):
        sizes = (128, 256, 512)
        peaks = []
        for L in sizes:
            q = _randn(rng, 1, 1, L, 64)
            peaks.append(peak_extra_memory(lambda q=q, b=backend: kernels.attention(q, q, q,
                                                                                    backend=b)))
        memory[backend] = loglog_slope(sizes, peaks)[0]
    verdict, condition = judge_c12((fit.ci_low, fit.ci_high), flop_slope, fit.dominance())
    values = {"lengths": list(C12_LENGTHS), "median_seconds": medians, "time_slope": fit.slope,
              "time_slope_low": fit.ci_low, "time_slope_high": fit.ci_high,
              "time_overhead_seconds": fit.overhead, "time_linear_seconds_per_L": fit.lower,
              "time_leading_share": fit.dominance(), "best_class": fit.best_class,
              "class_share": fit.class_share, "flop_slope": flop_slope,
              "samples": [times[L]["samples"] for L in C12_LENGTHS],
              "memory_slope_reference": memory["reference"],
              "memory_slope_numba": memory["numba"], "load_average": load_average()}
    measured = (f"CPU time ∝ {exponent_text('L', fit.slope, fit.ci_low, fit.ci_high)} (95%, "
                f"{fit.method.replace('x', 'L')}; the L^p term is "
                f"{fit.dominance():.0%} of the largest L's time; best class "
                f"{CLASS_NAMES[fit.best_class].format(v='L')} in "
                f"{fit.class_share:.0%} of resamples; one thread; L = "
                f"{', '.join(map(str, C12_LENGTHS))}, 1 head, d 64: "
                f"{', '.join(f'{m * 1e3:.2f}' for m in medians)} ms); FLOPs ∝ "
                f"L^{flop_slope:.2f}; peak memory ∝ L^{memory['reference']:.2f} (reference) vs "
                f"L^{memory['numba']:.2f} (fused numba)")
    return Result(verdict, measured, condition=condition, values=values,
                  details="Compute is O(L²); memory is O(L²) only when the L×L scores are "
                          "materialised: the fused kernel (online softmax) needs O(L). "
                          f"Holds when the whole interval lies within 2 ± {TOLERANCE}.")


def judge_c18(is_view: bool, share_interval: tuple[float, float]) -> tuple[str, str]:
    """Verdict on "the concat costs nothing": holds if merging the heads is a view (no copy);
    if it copies, holds-with-caveat when the whole 95% interval of its share of the
    attention call it follows (widened by the run-to-run allowance
    :data:`~attnbench.claims.rules.RUN_TO_RUN`) is under 5 %, does-not-hold when wholly above,
    inconclusive otherwise.  Returns (verdict, condition)."""
    if is_view:
        return HOLDS, ""
    low, high = share_interval
    where = side(*widen(low, high), 0.0, 0.05)
    if where == "inside":
        return CAVEAT, (f"no arithmetic, but not free: a transpose + reshape copies the "
                        f"B·L·d_model outputs, {low:.2%}–{high:.2%} of the attention call's "
                        "time here")
    return (FAILS, "") if where == "outside" else (INCONCLUSIVE, "")


def c18() -> Result:
    """Rule: :func:`judge_c18` on whether kernels.multihead.merge_heads returns a view of the
    batched result (np.shares_memory) and on its time relative to the attention call that
    produced it (BERT-base shape: 12 heads, L = 512, d_head = 64; single-thread CPU time,
    interleaved, ratio interval by bootstrap)."""
    rng = np.random.default_rng(31)
    q = _randn(rng, 1, 12, 512, 64)
    heads = kernels.attention(q, q, q)  # (1, 12, 512, 64)
    merged = multihead.merge_heads(heads)  # (1, 512, 768)
    is_view = bool(np.shares_memory(merged, heads))
    split_view = bool(np.shares_memory(multihead.split_heads(merged, 12), merged))
    times = interleaved_medians({"merge": lambda: multihead.merge_heads(heads),
                                 "attention": lambda: kernels.attention(q, q, q)},
                                rounds=2, max_time=0.1, cpu=True)
    share, low, high = ratio(times, "merge", "attention")
    verdict, condition = judge_c18(is_view, (low, high))
    values = {"merge_is_view": is_view, "split_is_view": split_view,
              "merge_seconds": times["merge"]["median"],
              "attention_seconds": times["attention"]["median"], "share": share,
              "share_low": low, "share_high": high}
    measured = (f"merge_heads (1, 12, 512, 64) → {merged.shape}: view of the heads: {is_view} "
                f"(a copy); {times['merge']['median'] * 1e6:.0f} µs vs "
                f"{times['attention']['median'] * 1e3:.1f} ms for the attention (CPU time) "
                f"({share:.2%} [{low:.2%}, {high:.2%}]); split_heads is a view: {split_view}")
    return Result(verdict, measured, condition=condition, values=values,
                  details="The copy is O(L·d_model) memory traffic, no FLOPs; PyTorch's "
                          ".transpose().contiguous().view() copies the same way.")


def c24() -> Result:
    """Rule: holds if 768 / 12 == 64, √64 == 8, and kernels.attention's default scale for
    D = 64 equals scale = 1/8 exactly (same output bits)."""
    d_head = 768 // 12
    rng = np.random.default_rng(32)
    q = _randn(rng, 1, 12, 16, d_head)
    same = bool(np.array_equal(kernels.attention(q, q, q), kernels.attention(q, q, q,
                                                                            scale=1 / 8)))
    ok = 768 % 12 == 0 and d_head == 64 and np.sqrt(d_head) == 8 and same
    return Result(HOLDS if ok else FAILS,
                  f"768 / 12 = {768 / 12:g}, √64 = {np.sqrt(64):g}; default scale of "
                  f"kernels.attention at D = 64 is 1/8: {same}",
                  values={"d_head": d_head, "default_scale_is_one_eighth": same})


def judge_c27(flops_equal: bool, exp_ratio: float,
              time_ratio: tuple[float, float, float]) -> tuple[str, str]:
    """Verdict on "12 heads of 64 cost the same as one head of 768": does-not-hold if the
    matmul FLOPs differ; otherwise holds-with-caveat, since the softmax work (exp count) and
    the score matrix are H times larger (``exp_ratio``), with the measured time ratio
    (12×64 / 1×768: ratio, low, high of its 95% interval) in the condition; the verdict
    does not rest on the timing.  Returns (verdict, condition)."""
    if not flops_equal:
        return FAILS, ""
    value, low, high = time_ratio
    return CAVEAT, (f"in matmul FLOPs (equal); the softmax work and L×L scores are "
                    f"{exp_ratio:.0f}× larger with 12 heads, and the measured cost was "
                    f"{value:.2f}× [{low:.2f}, {high:.2f}] that of one 768-wide head")


def c27() -> Result:
    """Rule: :func:`judge_c27` on the FLOP counts (attnbench.measure.flops), the exp counts (H·L²)
    and the cost of kernels.attention for (12 heads, d 64) vs (1 head, d 768) at L = 512
    (single-thread CPU time, interleaved medians)."""
    L = 512
    flops12, flops1 = attention_flops(1, 12, L, L, 64), attention_flops(1, 1, L, L, 768)
    rng = np.random.default_rng(33)
    q12, q1 = _randn(rng, 1, 12, L, 64), _randn(rng, 1, 1, L, 768)
    times = interleaved_medians({"12x64": lambda: kernels.attention(q12, q12, q12),
                                 "1x768": lambda: kernels.attention(q1, q1, q1)},
                                rounds=2, max_time=0.1, cpu=True)
    time_ratio = ratio(times, "12x64", "1x768")
    exp_ratio = (12 * L * L) / (1 * L * L)
    verdict, condition = judge_c27(flops12 == flops1, exp_ratio, time_ratio)
    values = {"flops_12x64": flops12, "flops_1x768": flops1, "exp_ratio": exp_ratio,
              "time_ratio": time_ratio[0], "time_ratio_low": time_ratio[1],
              "time_ratio_high": time_ratio[2], "seconds_12x64": times["12x64"]["median"],
              "seconds_1x768": times["1x768"]["median"], "load_average": load_average()}
    measured = (f"L = {L}: FLOPs {flops12:,} vs {flops1:,}; exps {12 * L * L:,} vs {L * L:,}; "
                f"CPU time (one thread) {times['12x64']['median'] * 1e3:.1f} ms vs "
                f"{times['1x768']['median'] * 1e3:.1f} ms (ratio {time_ratio[0]:.2f} "
                f"[{time_ratio[1]:.2f}, {time_ratio[2]:.2f}])")
    return Result(verdict, measured, condition=condition, values=values,
                  details="Projections (4·d_model² per token) are the same either way.")


def c28() -> Result:
    """Rule: the quoted numbers must equal the formula and the real
    kernels.MultiHeadAttention(768, 12) arrays: 2,359,296 without bias, 2,362,368 with, and
    12 layers rounding to 28.3M (to 0.1M).  holds if all three match."""
    no_bias = kernels.MultiHeadAttention(768, 12, bias=False).num_parameters()
    with_bias = kernels.MultiHeadAttention(768, 12).num_parameters()
    formula = params.attention_params_per_layer(params.get_config("bert-base"))
    twelve = 12 * with_bias
    ok = (no_bias == 2_359_296 and with_bias == 2_362_368 == formula
          and rounds_to(twelve / 1e6, 28.3, 0.1))
    measured = (f"kernels.MultiHeadAttention(768, 12): {no_bias:,} without bias, {with_bias:,} "
                f"with (formula {formula:,}); × 12 layers = {twelve:,} ≈ {twelve / 1e6:.1f}M")
    return Result(HOLDS if ok else FAILS, measured,
                  values={"no_bias": no_bias, "with_bias": with_bias, "twelve_layers": twelve})


def judge_c29(time_ratio: tuple[float, float, float], flop_ratio: float,
              layer_flop_ratio: float) -> tuple[str, str]:
    """Verdict on "512 → 192 makes attention about 7× faster": does-not-hold if the FLOP
    ratio does not round to 7 (6.5–7.5).  Otherwise the measured time ratio (ratio, low,
    high of its 95% interval, widened by the run-to-run allowance
    :data:`~attnbench.claims.rules.RUN_TO_RUN`) is judged against "about 7" (±15 %: 5.95–8.05):
    holds-with-caveat if the whole interval is inside (the whole encoder layer, whose
    projections and MLP are linear in L, speeds up only by ``layer_flop_ratio``);
    does-not-hold if it is wholly outside; inconclusive if it straddles an end.  Returns
    (verdict, condition)."""
    if not rounds_to(flop_ratio, 7, 1):
        return FAILS, ""
    value, low, high = time_ratio
    where = side(*widen(low, high), 7 * (1 - ABOUT_RELATIVE), 7 * (1 + ABOUT_RELATIVE))
    if where == "inside":
        return CAVEAT, (f"for the attention alone (measured {value:.1f}× [{low:.1f}, "
                        f"{high:.1f}]); a whole BERT-base layer, whose projections and MLP "
                        f"are linear in L, does {layer_flop_ratio:.1f}× fewer FLOPs")
    return (FAILS, "") if where == "outside" else (INCONCLUSIVE, "")


def bert_layer_flops(L: int, d: int = 768, d_ff: int = 3072) -> int:
    """FLOPs of one BERT encoder layer: Q, K, V, O projections, the MLP and attention."""
    return 2 * L * (4 * d * d + 2 * d * d_ff) + attention_flops(1, 12, L, L, d // 12)


def c29() -> Result:
    """Rule: :func:`judge_c29` on the cost of kernels.attention at the BERT-base shape
    (12 heads, d_head 64) for L = 512 and L = 192 (single-thread CPU time, interleaved
    medians), the FLOP ratio (512/192)² and the whole layer's FLOP ratio.  The
    multi-threaded wall-clock ratio is measured too and reported, not judged: on a busy
    machine a parallel launch waits for cores other processes hold, a fixed delay that
    weighs most on the small call."""
    rng = np.random.default_rng(34)
    q512, q192 = _randn(rng, 1, 12, 512, 64), _randn(rng, 1, 12, 192, 64)
    functions = {512: lambda: kernels.attention(q512, q512, q512),
                 192: lambda: kernels.attention(q192, q192, q192)}
    cost = interleaved_medians(functions, rounds=5, max_time=0.1, cpu=True, budget=2.0)
    wall = interleaved_medians(functions, rounds=2, max_time=0.1)
    plan = kernels.attention_plan().get("float32", "not planned")
    path = f"micro-kernel {plan}" if "x" in plan else f"BLAS tiles (planner: {plan})"
    time_ratio = ratio(cost, 512, 192)
    wall_ratio = ratio(wall, 512, 192)
    flop_ratio = attention_flops(1, 12, 512, 512, 64) / attention_flops(1, 12, 192, 192, 64)
    layer_ratio = bert_layer_flops(512) / bert_layer_flops(192)
    verdict, condition = judge_c29(time_ratio, flop_ratio, layer_ratio)
    values = {"time_ratio": time_ratio[0], "time_ratio_low": time_ratio[1],
              "time_ratio_high": time_ratio[2], "flop_ratio": flop_ratio,
              "layer_flop_ratio": layer_ratio, "cpu_seconds_512": cost[512]["median"],
              "cpu_seconds_192": cost[192]["median"], "wall_ratio_threaded": wall_ratio[0],
              "wall_ratio_threaded_low": wall_ratio[1], "wall_ratio_threaded_high": wall_ratio[2],
              "wall_seconds_512": wall[512]["median"], "wall_seconds_192": wall[192]["median"],
              "load_average": load_average(), "numba_path": path}
    measured = (f"kernels.attention (1, 12, L, 64), numba's {path}, CPU time on one thread: "
                f"{cost[512]['median'] * 1e3:.1f} ms at 512 vs {cost[192]['median'] * 1e3:.2f} "
                f"ms at 192, ratio {time_ratio[0]:.2f} [{time_ratio[1]:.2f}, "
                f"{time_ratio[2]:.2f}] (95%); FLOP ratio (512/192)² = {flop_ratio:.2f}; "
                f"whole BERT-base layer FLOP ratio {layer_ratio:.2f}; wall clock with all "
                f"threads: ratio {wall_ratio[0]:.2f} [{wall_ratio[1]:.2f}, "
                f"{wall_ratio[2]:.2f}] (load average {values['load_average']:.1f})")
    return Result(verdict, measured, condition=condition, values=values,
                  details="Ratios of interleaved medians in this run, 95% intervals by "
                          "bootstrap over the samples. The verdict uses the "
                          "single-thread CPU time (the cost); the threaded wall-clock ratio "
                          "depends on machine load and thread scheduling.")
