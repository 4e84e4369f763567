"""The claims ledger (attnbench.claims.ledger): its shape, each check's computed values, and the
judging rules of the timing claims with injected measurements (never their live verdicts,
which depend on machine load)."""

import numpy as np
import pytest

from attnbench import kernels
from attnbench.claims import attention as checks_attention
from attnbench.claims import cost as checks_cost
from attnbench.claims import ledger as claims
from attnbench.claims import masking as checks_masking
from attnbench.claims import softmax as checks_softmax
from attnbench.claims.rules import (
    CAVEAT,
    ERROR,
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    VERDICTS,
    Result,
    about,
    loglog_slope,
    rounds_to,
    side,
)
from attnbench.measure.flops import attention_flops

#: Claims whose verdict rests on timings; their verdicts are not asserted here.
TIMED = {"C12", "C18", "C27", "C29"}


@pytest.fixture(scope="module")
def ledger():
    return claims.verify_claims().set_index("id", drop=False)


def test_every_claim_has_a_row_and_a_verdict(ledger):
    assert list(ledger["id"]) == [f"C{i:02d}" for i in range(1, 32)]
    assert set(claims.COLUMNS) <= set(ledger.columns)
    assert ledger["verdict"].isin(VERDICTS).all()
    assert (ledger["verdict"] != ERROR).all(), ledger.loc[ledger["verdict"] == ERROR, "measured"]
    assert (ledger["measured"].str.len() > 0).all()
    caveats = ledger[ledger["verdict"] == CAVEAT]
    assert (caveats["condition"].str.len() > 0).all()


def test_deterministic_verdicts(ledger):
    # Verdicts decided by exact arithmetic or seeded data: the same on every machine.
    expected = {
        "C01": CAVEAT, "C02": HOLDS, "C03": CAVEAT, "C04": HOLDS, "C05": FAILS, "C06": HOLDS,
        "C07": HOLDS, "C08": HOLDS, "C09": HOLDS, "C10": HOLDS, "C11": CAVEAT, "C13": HOLDS,
        "C14": CAVEAT, "C15": CAVEAT, "C16": CAVEAT, "C17": HOLDS, "C19": CAVEAT,
        "C20": CAVEAT, "C21": HOLDS, "C22": FAILS, "C23": FAILS, "C24": HOLDS, "C25": CAVEAT,
        "C26": HOLDS, "C28": HOLDS, "C30": CAVEAT, "C31": CAVEAT,
    }
    assert not TIMED & set(expected)
    assert TIMED | set(expected) == set(ledger["id"])  # every untimed claim is asserted
    assert {cid: ledger.loc[cid, "verdict"] for cid in expected} == expected


# --- values each check computes --------------------------------------------------------------


def test_c23_computes_the_real_softmax():
    result = checks_softmax.c23()
    computed = np.array(result.values["computed"])
    assert np.allclose(computed, kernels.softmax(np.array([0.9, 0.1, 0.3])), atol=1e-4)
    assert np.allclose(computed, [0.5005, 0.2249, 0.2747], atol=1e-4)  # e^x / Σ e^x
    assert result.values["max_abs_difference"] == pytest.approx(0.2295, abs=1e-3)
    assert np.allclose(result.values["plain_normalisation"], [0.6923, 0.0769, 0.2308], atol=1e-4)
    assert result.verdict == FAILS


def test_c03_numbers():
    v = checks_softmax.c03().values
    assert v["exp10_minus_exp9"] == pytest.approx(np.exp(10) - np.exp(9))
    assert v["ratio"] == pytest.approx(np.exp(8))  # 2,981 > 2,500
    assert v["softmax_ratio_same_vector"] == pytest.approx(np.exp(8))
    assert v["softmax_ratio_separate_vectors"] == pytest.approx(1.0)
    assert not v["stated_12000_matches"] and v["stated_4_7_matches"]


def test_c09_c24_c28_numbers():
    assert checks_cost.c09().values == {"n_heads": 96, "per_head_shape": [128, 12288]}
    assert checks_cost.c24().values["d_head"] == 64
    v = checks_cost.c28().values
    assert (v["no_bias"], v["with_bias"], v["twelve_layers"]) == (2_359_296, 2_362_368,
                                                                   28_348_416)


def test_c10_c11_parameter_shares():
    assert checks_cost.c10().values["gpt3-175b"]["ratio"] == 1.0
    v = checks_cost.c11().values
    assert v["attention_share"]["gpt3-175b"] == pytest.approx(0.3321, abs=1e-4)
    assert v["attention_share"]["bert-base"] == pytest.approx(0.2589, abs=1e-4)
    assert v["attention_share_non_embedding"]["gpt3-175b"] == pytest.approx(1 / 3, abs=1e-4)


def test_c01_float_thresholds():
    v = checks_softmax.c01().values
    assert v["float32_zero_gap"] == pytest.approx(150 * np.log(2), abs=0.01)  # 103.97
    assert v["float64_zero_gap"] == pytest.approx(1075 * np.log(2), abs=0.01)  # 745.13
    assert v["float64_all_in_open_interval"]


def test_c05_literal_form_is_undefined_and_corrected_form_matches():
    v = checks_attention.c05().values
    assert not v["literal_defined_for_dv_ne_n"]
    assert v["square_case_min_difference"] > 0.1
    assert v["corrected_form_error"] < 1e-12


def test_c15_onset_and_c16_threshold():
    c15 = checks_softmax.c15()
    assert c15.values["onset_d_k"] == 512
    # decided from real gradients: the median query gradient shrinks below the scaled one
    # from d_k = 512 on, and the verdict says the numbers it was decided from
    assert c15.values["shrinks_from_d_k"] == 512
    top = c15.values["unscaled_dq_median"][1024]
    assert top < 0.2 * c15.values["scaled_dq_median"][1024]
    assert f"median ‖dQ‖ row {top:.3g} unscaled" in c15.measured
    assert "from d_k = 512" in c15.condition
    v = checks_softmax.c16().values
    assert v["[0.9, 0.1, 0.3]"]["c_star"] == pytest.approx(2.33, abs=0.01)
    assert not v["[0.9, 0.1, 0.3]"]["sharper_at_1"]


def test_c19_layer_norm_rows():
    v = checks_attention.c19().values
    assert v["max_abs_row_mean"] < 1e-9
    low, high = v["row_variance_range"]
    assert 0.99 < low <= high <= 1.0  # eps pulls the (biased) variance below 1
    assert v["unbiased_variance_mean"] == pytest.approx(1.5, abs=0.01)  # d/(d-1), d = 3
    assert v["variance_near_constant_row"] < 0.1


def test_c22_counterexample_from_the_article():
    v = checks_attention.c22().values
    assert v["example_self_wins"] == [True, True, False, True]  # "this" attends to "love"
    assert not v["pair_self_wins"] and v["equal_norm_self_wins"]


def test_c25_c31_masks():
    v = checks_masking.c25().values
    assert v["max_pad_weight"] == 0 and v["all_pad_row_weight"] == pytest.approx(1 / 8)
    v = checks_masking.c31().values
    assert v["exp_neg_inf_float32"] and v["masked_weights_exactly_zero"]
    assert v["plain_softmax_all_masked_nan"] and v["kernels_all_masked"] == [0.0] * 4


def test_c26_dropout_fraction():
    v = checks_masking.c26().values
    assert abs(v["dropped_fraction"] - 0.1) <= 5 * v["sigma"]
    assert v["kept_scaled_by_1_over_1_minus_p"]


def test_c27_c29_flop_counts():
    # 12 heads of 64 cost what one head of 768 costs (the FLOP count the claims use)
    assert attention_flops(1, 12, 512, 512, 64) == attention_flops(1, 1, 512, 512, 768) \
        == 2 * 12 * 512 * 512 * (64 + 64)
    assert checks_cost.bert_layer_flops(512) / checks_cost.bert_layer_flops(192) \
        == pytest.approx(2.84, abs=0.01)


# --- judging rules, with injected measurements -----------------------------------------------

JUDGE_C29 = [
    # (time ratio, its 95% interval), FLOP ratio, layer FLOP ratio -> verdict
    # (the interval is widened by RUN_TO_RUN = 5% before it is compared with 5.95-8.05)
    pytest.param((7.0, 6.8, 7.2), 7.11, 2.84, CAVEAT, id="about-7-attention-only"),
    pytest.param((6.5, 6.4, 6.6), 7.11, 2.84, CAVEAT, id="6.5-interval-within-15pct"),
    pytest.param((6.0, 5.97, 6.05), 7.11, 2.84, INCONCLUSIVE, id="6.0-within-but-not-by-5pct"),
    pytest.param((5.4, 5.3, 5.5), 7.11, 2.84, FAILS, id="5.4-interval-too-slow-a-drop"),
    pytest.param((5.9, 5.8, 5.94), 7.11, 2.84, INCONCLUSIVE, id="5.9-within-5pct-of-5.95"),
    pytest.param((6.0, 5.8, 6.2), 7.11, 2.84, INCONCLUSIVE, id="interval-straddles-5.95"),
    pytest.param((8.8, 8.6, 9.0), 7.11, 2.84, FAILS, id="8.8-too-fast"),
    pytest.param((7.0, 6.8, 7.2), 5.0, 2.84, FAILS, id="flops-not-7"),
]


@pytest.mark.parametrize("time_ratio, flop_ratio, layer_ratio, verdict", JUDGE_C29)
def test_judge_c29(time_ratio, flop_ratio, layer_ratio, verdict):
    got, condition = checks_cost.judge_c29(time_ratio, flop_ratio, layer_ratio)
    assert got == verdict
    assert (got == CAVEAT) == bool(condition)
    if got == CAVEAT:
        assert f"{layer_ratio:.1f}" in condition


@pytest.mark.parametrize("interval, flop_slope, verdict", [
    ((1.95, 2.02), 2.0, HOLDS), ((1.6, 1.7), 2.0, CAVEAT), ((2.3, 2.4), 2.0, CAVEAT),
    ((1.7, 2.1), 2.0, INCONCLUSIVE), ((1.94, 2.61), 2.0, INCONCLUSIVE),
    ((1.95, 2.02), 1.0, FAILS)])
def test_judge_c12(interval, flop_slope, verdict):
    assert checks_cost.judge_c12(interval, flop_slope)[0] == verdict


def test_judge_c12_is_inconclusive_when_the_lower_order_terms_dominate():
    assert checks_cost.judge_c12((1.95, 2.02), 2.0, leading_share=0.4)[0] == INCONCLUSIVE
    assert checks_cost.judge_c12((1.95, 2.02), 2.0, leading_share=0.6)[0] == HOLDS


@pytest.mark.parametrize("is_view, share, verdict", [
    (True, (0.4, 0.6), HOLDS), (False, (0.002, 0.004), CAVEAT), (False, (0.1, 0.3), FAILS),
    (False, (0.04, 0.06), INCONCLUSIVE)])
def test_judge_c18(is_view, share, verdict):
    assert checks_cost.judge_c18(is_view, share)[0] == verdict


def test_judge_c27():
    assert checks_cost.judge_c27(True, 12, (1.9, 1.8, 2.0))[0] == CAVEAT
    assert "1.90× [1.80, 2.00]" in checks_cost.judge_c27(True, 12, (1.9, 1.8, 2.0))[1]
    assert checks_cost.judge_c27(False, 12, (1.0, 0.9, 1.1))[0] == FAILS


def test_side_of_an_interval():
    assert side(1.0, 2.0, 0.5, 2.5) == "inside"
    assert side(3.0, 4.0, 0.5, 2.5) == "outside" and side(0.0, 0.4, 0.5, 2.5) == "outside"
    assert side(2.0, 3.0, 0.5, 2.5) == "straddles"
    assert side(float("nan"), 1.0, 0.5, 2.5) == "straddles"


# --- the machinery -----------------------------------------------------------------------------


def test_a_check_that_raises_is_an_error_row(monkeypatch):
    def broken():
        raise RuntimeError("boom")

    claim = claims.CLAIMS["C03"]
    monkeypatch.setitem(claims.CLAIMS, "C03", claims.Claim(claim.id, claim.source, claim.text,
                                                           broken))
    ledger = claims.verify_claims(["C03", "C24"])
    assert list(ledger["verdict"]) == [ERROR, HOLDS]
    assert "RuntimeError: boom" in ledger["measured"].iloc[0]


def test_ids_are_normalised_and_checked():
    assert list(claims.verify_claims(["c9", "24"])["id"]) == ["C09", "C24"]
    with pytest.raises(ValueError, match="unknown claim id"):
        claims.verify_claims(["C32"])


def test_result_needs_a_known_verdict_and_a_condition_for_caveats():
    with pytest.raises(ValueError, match="verdict"):
        Result("maybe", "x")
    with pytest.raises(ValueError, match="condition"):
        Result(CAVEAT, "x")


def test_number_rules():
    assert rounds_to(4.67, 4.7, 0.1) and not rounds_to(13_923, 12_000, 1_000)
    assert rounds_to(28.348, 28.3, 0.1)
    assert about(6.0, 7) and not about(5.9, 7)
    slope, ci = loglog_slope([1, 2, 4, 8], [3, 12, 48, 192])
    assert slope == pytest.approx(2) and ci == pytest.approx(0, abs=1e-9)


def test_section_and_html(ledger):
    section = claims.section(ledger.reset_index(drop=True))
    assert section.anchor == "claims"
    caption, table = section.tables[0]
    assert len(table) == 31 and "verdict" in table
    html = table.attrs["html"]
    assert '<table id="claims-table" class="claims">' in html
    assert html.count('class="verdict verdict-') == 31
    assert 'id="claim-C23" data-verdict="does-not-hold"' in html


def test_json_and_text(ledger):
    import json

    records = json.loads(claims.ledger_json(ledger.reset_index(drop=True)))
    assert len(records) == 31 and {"id", "verdict", "measured"} <= set(records[0])
    text = claims.format_ledger(ledger.reset_index(drop=True))
    assert "C23  DOES-NOT-HOLD" in text and "31 claims:" in text


def test_cpu_timing_restores_the_thread_count():
    import numba

    from attnbench.claims.rules import interleaved_medians

    before = numba.get_num_threads()
    times = interleaved_medians({"sum": lambda: sum(range(1000))}, rounds=1, max_time=0.001,
                                cpu=True)
    assert numba.get_num_threads() == before
    assert times["sum"]["median"] > 0 and times["sum"]["samples"] >= 3
    assert times["sum"]["ci_low"] <= times["sum"]["median"] <= times["sum"]["ci_high"]
