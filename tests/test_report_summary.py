"""The summary cards' rules, the tones, and how tables format numbers and verdicts."""

import numpy as np
import pandas as pd
import pytest

from attnbench.report import summary
from attnbench.report.tables import claims_filter, format_number, table_html
from attnbench.section import TONES, Section, tone_of
from attnbench.studies.scaling import scaling_table
from tests.test_scaling import synthetic_sweep


@pytest.mark.parametrize(("word", "tone"), [
    ("confirmed", "ok"), ("holds", "ok"), (True, "ok"), ("ok", "ok"),
    ("inconclusive", "warn"), ("holds-with-caveat", "warn"), ("skipped", "warn"),
    ("not confirmed", "bad"), ("does-not-hold", "bad"), ("failed", "bad"), (False, "bad"),
    ("float32", "none"),
])
def test_one_tone_per_verdict_word(word, tone):
    assert tone_of(word) == tone


def test_the_ledger_uses_the_reports_palette():
    from attnbench.claims.ledger import VERDICT_COLOURS

    assert VERDICT_COLOURS["holds"] == TONES["ok"]
    assert VERDICT_COLOURS["holds-with-caveat"] == TONES["warn"]
    assert VERDICT_COLOURS["does-not-hold"] == TONES["bad"]


def test_time_cards_follow_the_fits_outcomes():
    table = synthetic_sweep()
    fits = scaling_table(table)
    cards = summary.cards(sweep=table, fits=fits)
    time_cards = {card.question: card for card in cards if card.question.startswith("O(L²)")}
    assert set(time_cards) == {"O(L²) time: numba", "O(L²) time: reference"}
    assert all(card.verdict == "confirmed" and card.tone == "ok"
               for card in time_cards.values())
    row = fits[(fits["quantity"] == "time") & (fits["variable"] == "L")
               & (fits["backend"] == "numba")].iloc[0]
    assert time_cards["O(L²) time: numba"].number == (f"time ∝ L^{row.slope:.2f} "
                                                      f"[{row.ci_low:.2f}, {row.ci_high:.2f}]")
    # a slope of 1.5 is not quadratic: the card must say so, in red
    slow = fits.copy()
    rows = (slow["quantity"] == "time") & (slow["variable"] == "L") & (slow["backend"] == "numba")
    slow.loc[rows, "outcome"] = "not confirmed"
    card = next(c for c in summary.cards(sweep=table, fits=slow)
                if c.question == "O(L²) time: numba")
    assert card.tone == "bad" and "not confirmed" in card.verdict


def test_agreement_card_turns_red_on_one_disagreeing_row():
    agreement = pd.DataFrame({"ok": [True] * 9 + [False]})
    card = summary.agreement_card(agreement, None)
    assert (card.verdict, card.tone, card.number) == ("disagreement", "bad",
                                                       "9/10 within tolerance")
    assert summary.agreement_card(agreement.iloc[:9], None).tone == "ok"


def test_stability_params_claims_and_machine_cards():
    stability = pd.DataFrame({"d_k": [4, 4, 1024, 1024], "scaled": [True, False, True, False],
                              "one_hot_fraction": [0.0, 0.0, 0.0, 0.64],
                              "entropy_fraction": [0.9, 0.7, 0.9, 0.1],
                              "max_weight_mean": [0.06, 0.2, 0.05, 0.93]})
    card = summary.stability_card(stability)
    assert (card.verdict, card.tone) == ("stays unsaturated", "ok")
    assert "64% of rows nearly one-hot" in " ".join(card.lines)
    saturated = stability.assign(one_hot_fraction=[0.0, 0.0, 0.2, 0.64])
    assert summary.stability_card(saturated).tone == "bad"
    params = pd.DataFrame({"mha_check": ["kernels.MultiHeadAttention: 5 = formula 5",
                                         "not built: too large"],
                           "difference_pct": [0.0, -1.43]})
    card = summary.params_card(params)
    assert (card.tone, card.number) == ("ok", "1/1 built layers = formula")
    wrong = params.assign(mha_check=["kernels.MultiHeadAttention: 6 != formula 5", "x"])
    assert summary.params_card(wrong).tone == "bad"
    claims = pd.DataFrame({"id": ["C01", "C02", "C03"],
                           "verdict": ["holds", "holds-with-caveat", "does-not-hold"]})
    card = summary.claims_card(claims)
    assert card.tone == "warn" and card.number == ("1 holds · 1 holds-with-caveat · "
                                                   "1 does-not-hold")
    assert summary.claims_card(claims.assign(verdict="holds")).tone == "ok"
    assert summary.claims_card(claims.assign(verdict=["holds", "error", "holds"])).tone == "bad"
    quiet = summary.machine_card({"usable_cores": 2, "load_average_1m": 0.3}, {}, None)
    busy = summary.machine_card({"usable_cores": 2, "load_average_1m": 6.9}, {}, None)
    assert (quiet.tone, busy.tone) == ("ok", "warn")


def test_cards_are_rendered_with_verdict_tone_and_link():
    section = summary.summary_section([summary.Card("Q", "confirmed", "ok", "1 ± 0", "sc")])
    assert isinstance(section, Section) and section.anchor == "summary"
    assert ('<a class="card tone-ok" href="#sc" data-tone="ok">' in section.html
            and '<span class="verdict">confirmed</span>' in section.html)


@pytest.mark.parametrize(("value", "column", "text"), [
    (2362368.0, "", "2,362,368"), (0.99999999999999978, "", "1"), (123.456, "", "123.5"),
    (0.0235, "", "0.0235"), (1.4838892092861045e-07, "max_abs_err", "1.5e-7"),
    (8.938e-4, "", "8.938e-4"), (np.nan, "", ""), (-0.22613752685714286, "", "-0.2261"),
])
def test_numbers_are_shown_to_meaningful_digits(value, column, text):
    assert format_number(value, column) == text


def test_tables_wrap_long_text_and_colour_verdicts():
    table = pd.DataFrame({"backend": ["numba"], "slope": [1.98765432], "outcome": ["confirmed"],
                          "note": ["x" * 80], "ok": [True]})
    page = table_html(table)
    assert "<td class=\"num\">1.988</td>" in page
    assert '<td class="tone-ok">confirmed</td>' in page
    assert '<td class="long">' in page and '<td class="tone-ok">yes</td>' in page


def test_claims_filter_offers_each_verdict_with_its_count():
    ledger = ('<table id="claims-table"><tbody><tr id="claim-C01" data-verdict="holds"></tr>'
              '<tr id="claim-C02" data-verdict="holds"></tr>'
              '<tr id="claim-C03" data-verdict="does-not-hold"></tr></tbody></table>')
    controls = claims_filter(ledger)
    assert "all (3)" in controls and "holds (2)" in controls and "does-not-hold (1)" in controls
    assert 'id="claims-filter-all" checked' in controls
