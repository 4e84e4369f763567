"""The cards at the top of the report: one per question the suite answers.

Each :class:`Card` carries a verdict word, a *tone* (the colour: :data:`TONES`), the
number behind the verdict and the anchor of the section that shows the evidence.
:func:`cards` builds them from what a results folder holds; every rule that decides a
card's verdict is written in the function that builds it, and reuses the verdicts the
sections below already decided (the scaling fits' outcomes, the claims' verdicts) rather
than deciding them again.

The questions, in order: agreement with the reference; O(L²) time, one card per backend;
O(L) memory of the fused kernel; the same two for the backward pass; O(L·W) time of
sliding windows and the speed-up of block skipping; the softmax's stability with the
1/√d_k scale; parameter arithmetic; the claims ledger; the machine and its noise.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

import pandas as pd

from attnbench.measure.machine import BUSY_LOAD_PER_CORE, busy_machine
from attnbench.report import variants
from attnbench.section import TONES, Section, tone_of
from attnbench.studies.scaling import WINDOW_VARIABLE
from attnbench.studies.scaling_claims import SKIPPING_BACKENDS
from attnbench.studies.scaling_verdicts import row_exponent
from attnbench.studies.variants import skipping_table

__all__ = ["Card", "cards", "render_cards", "summary_section"]


@dataclass
class Card:
    """One question of the summary and its answer."""

    question: str  # e.g. "O(L²) time: numba"
    verdict: str  # the answer in words, e.g. "confirmed"
    tone: str  # "ok", "warn", "bad" or "none" (nothing measured): the card's colour
    number: str  # the number behind the verdict, e.g. "time ∝ L^1.98 [1.95, 2.01]"
    link: str  # anchor of the section with the evidence
    lines: list[str] = field(default_factory=list)  # further short facts


def _worst(tones) -> str:
    tones = [t for t in tones if t != "none"]
    for tone in ("bad", "warn", "ok"):
        if tone in tones:
            return tone
    return "none"


def _outcome(row) -> str:
    """The fit's outcome as :mod:`attnbench.studies.scaling` decided it (its ``outcome``
    column; "measured" where a row has none): never read again from the numbers."""
    outcome = row.get("outcome")
    return outcome if isinstance(outcome, str) and outcome else "measured"


def _fit_line(quantity: str, row) -> str:
    """``time ∝ L^1.98 [1.95, 2.01]`` as the console writes it
    (:func:`attnbench.studies.scaling_verdicts.row_exponent`), or why there is no fit."""
    if pd.isna(row.get("slope")):
        reason = row.get("conclusion")
        return f"no fit ({reason})" if isinstance(reason, str) and reason else "no fit"
    return f"{quantity} ∝ {row_exponent(row)}"


def agreement_card(agreement: pd.DataFrame | None, sweep: pd.DataFrame | None) -> Card:
    """Every backend against the oracle: agree only if every checked row is within tolerance."""
    lines, tones, checked, agree = [], [], 0, 0
    if agreement is not None and not agreement.empty:
        ok = agreement["ok"].astype(bool)
        checked, agree = len(ok), int(ok.sum())
        tones.append("ok" if ok.all() else "bad")
        lines.append(f"agreement check: {agree}/{checked} (case, dtype, backend) rows")
    if sweep is not None and "within_tolerance" in sweep:
        within = sweep["within_tolerance"].astype("boolean").dropna()
        if len(within):
            tones.append("ok" if within.all() else "bad")
            lines.append(f"sweep: {int(within.sum())}/{len(within)} points within tolerance")
            checked, agree = checked + len(within), agree + int(within.sum())
    tone = _worst(tones)
    verdict = {"ok": "all agree", "bad": "disagreement", "none": "not checked"}[tone]
    return Card("Kernels agree with the reference", verdict, tone,
                f"{agree}/{checked} within tolerance" if checked else "nothing checked",
                "agreement" if agreement is not None else "sweep", lines)


def _fit_cards(fits: pd.DataFrame, quantity: str, backends, question, link, *,
               variable: str = "L") -> list[Card]:
    """One card per backend: its fits of ``quantity`` against ``variable``, worst outcome
    decides.  ``fits`` holds the series the cards are about (one direction, variant)."""
    if fits is None or fits.empty:
        return []
    rows = fits[(fits["quantity"] == quantity) & (fits["variable"] == variable)]
    result = []
    for backend in backends or list(dict.fromkeys(rows["backend"])):
        mine = rows[rows["backend"] == backend]
        if mine.empty:
            continue
        outcomes = [_outcome(row) for _, row in mine.iterrows()]
        tone = _worst(tone_of(o) for o in outcomes)
        confirmed = sum(o == "confirmed" for o in outcomes)
        verdict = {"ok": "confirmed", "bad": "not confirmed",
                   "warn": "inconclusive", "none": "not fitted"}[tone]
        if tone != "ok" and confirmed:
            verdict = f"confirmed in {confirmed} of {len(outcomes)} series"
        lines = [f"{row['mask']}, {row['dtype']}: " + _fit_line(quantity, row)
                 + ("" if pd.isna(row.get("slope")) else f" ({outcome})")
                 for (_, row), outcome in zip(mine.iterrows(), outcomes, strict=True)]
        order = ["_o", "ci95"] if "ci95" in mine else ["_o"]  # other fit columns may come
        best = mine.assign(_o=[o == "confirmed" for o in outcomes]).sort_values(
            order, ascending=[False, True][:len(order)], na_position="last").iloc[0]
        number = (_fit_line(quantity, best) if not pd.isna(best.get("slope"))
                  else "too few usable points")
        result.append(Card(question.format(backend=backend), verdict, tone, number, link,
                           lines[:4] + ([f"… {len(lines) - 4} more in the Fits table"]
                                        if len(lines) > 4 else [])))
    return result


def skipping_card(sweep: pd.DataFrame | None) -> Card | None:
    """Block skipping pays when every variant of ideal speed-up ≥ 2 of a backend that skips
    tiles (:data:`~attnbench.studies.scaling_claims.SKIPPING_BACKENDS`) runs faster than its plain
    call (the lower end of the ratio's interval above 1, or the ratio without one); amber
    when some does not, grey without such variants."""
    if sweep is None or sweep.empty or "variant" not in sweep:
        return None
    skips = skipping_table(sweep)
    if not skips.empty:  # the peers compute a dense mask: nothing to skip
        skips = skips[skips["backend"].isin(SKIPPING_BACKENDS)]
    if skips.empty:
        return None
    sparse = skips[skips["ideal_speedup"] >= 2]
    faster = sparse["speedup_low"].fillna(sparse["speedup"]) > 1
    tone = "none" if sparse.empty else ("ok" if faster.all() else "warn")
    best = variants.best_skip(skips)
    lines = [f"{row.backend} {row.direction} {row.variant} L={row.L}: {row.speedup:.2f}× "
             f"(ideal {row.ideal_speedup:.2f}×, density {row.density:.2g})"
             for row in sparse.sort_values("ideal_speedup").tail(4).itertuples()]
    return Card("Block skipping of sparse variants",
                {"ok": "pays", "warn": "does not always pay", "none": "no sparse variant"}[tone],
                tone, f"{best['speedup']:.2f}× faster at density {best['density']:.2g} "
                f"(ideal {best['ideal_speedup']:.2f}×)", "variants", lines)


def stability_card(stability: pd.DataFrame | None) -> Card | None:
    """Scaled softmax unsaturated: at most 1 % nearly one-hot rows at every d_k with 1/√d_k."""
    if stability is None or "one_hot_fraction" not in stability:
        return None
    scaled = stability[stability["scaled"].astype(str) == "True"]
    raw = stability[stability["scaled"].astype(str) == "False"]
    if scaled.empty:
        return None
    worst = float(scaled["one_hot_fraction"].max())
    tone = "ok" if worst <= 0.01 else "bad"
    top = raw.loc[raw["d_k"].idxmax()] if not raw.empty else None
    lines = [f"with 1/√d_k: row entropy ≥ {scaled['entropy_fraction'].min():.0%} of log L "
             f"for d_k {scaled['d_k'].min()}–{scaled['d_k'].max()}"]
    if top is not None:
        lines.append(f"without it, at d_k = {top['d_k']}: {top['one_hot_fraction']:.0%} of "
                     f"rows nearly one-hot, largest weight {top['max_weight_mean']:.2f} on "
                     "average")
    return Card("Softmax stays unsaturated with 1/√d_k",
                "stays unsaturated" if tone == "ok" else "saturates", tone,
                f"{worst:.0%} nearly one-hot rows with the scale (rule: ≤ 1 %)",
                "stability", lines)


def params_card(params: pd.DataFrame | None) -> Card | None:
    """Parameter counts: every MultiHeadAttention built for real must equal its formula."""
    if params is None or "mha_check" not in params:
        return None
    checks = params["mha_check"].astype(str)
    built = checks[~checks.str.startswith("not built")]
    matches = int(built.str.contains(" = formula ").sum())
    tone = "none" if built.empty else ("ok" if matches == len(built) else "bad")
    lines = []
    if "difference_pct" in params:
        diff = pd.to_numeric(params["difference_pct"], errors="coerce").abs()
        if diff.notna().any():
            lines.append(f"formula totals within {diff.max():.2g} % of the published "
                         f"totals of {int(diff.notna().sum())} models (these are rounded)")
    lines.append(f"{len(checks) - len(built)} models counted from shapes only (too large "
                 "to build)")
    return Card("Parameter arithmetic", {"ok": "counts match", "bad": "mismatch",
                                         "none": "not built"}[tone], tone,
                f"{matches}/{len(built)} built layers = formula", "params", lines)


def claims_card(claims: pd.DataFrame | None) -> Card | None:
    """The ledger: amber when some claims do not hold as stated, red if a check raised."""
    if claims is None or "verdict" not in claims:
        return None
    counts = claims["verdict"].value_counts()
    errors = int(counts.get("error", 0))
    not_all = int(counts.get("does-not-hold", 0) + counts.get("holds-with-caveat", 0))
    tone = "bad" if errors else ("warn" if not_all else "ok")
    fails = int(counts.get("does-not-hold", 0))
    verdict = ("a check raised" if errors else
               f"{fails} do not hold as stated" if fails else
               "some hold only with a caveat" if not_all else "every claim holds")
    number = " · ".join(f"{int(counts.get(word, 0))} {word}" for word in
                        ("holds", "holds-with-caveat", "does-not-hold", "error")
                        if counts.get(word, 0) or word != "error")
    lines = [f"does not hold: {', '.join(claims.loc[claims['verdict'] == 'does-not-hold', 'id'])}"]
    return Card(f"The {len(claims)} claims of the articles", verdict, tone, number, "claims",
                lines if "does-not-hold" in counts else [])


def machine_card(record: dict, meta: dict, sweep: pd.DataFrame | None) -> Card | None:
    """Quiet when the load stayed ≤ half the cores, the median IQR/median is ≤ 5 % and no
    point ran above 100 % of the peak (which only a peak measured too low allows)."""
    if not record and not meta:
        return None
    cores = record.get("usable_cores") or (meta.get("machine") or {}).get("usable_cores")
    loads = [x for x in (record.get("load_average_1m"), meta.get("load_average_1m_start"),
                         meta.get("load_average_1m_end")) if isinstance(x, int | float)]
    noise = None
    if sweep is not None and {"iqr_ms", "median_ms", "status"} <= set(sweep.columns):
        ok = sweep[(sweep["status"] == "ok") & (sweep["median_ms"] > 0)]
        if not ok.empty:
            noise = float((ok["iqr_ms"] / ok["median_ms"]).median())
    busy = bool(loads) and busy_machine(max(loads), cores)
    noisy = noise is not None and noise > 0.05
    above_peak = 0
    if sweep is not None and "pct_of_gemm_peak" in sweep:
        above_peak = int((pd.to_numeric(sweep["pct_of_gemm_peak"], errors="coerce") > 100).sum())
        noisy = noisy or above_peak > 0
    tone = "none" if not loads and noise is None else ("warn" if busy or noisy else "ok")
    verdict = {"ok": "quiet", "warn": "busy or noisy: compare ratios, not times",
               "none": "not recorded"}[tone]
    lines = [f"{record.get('cpu_model', '?')}, {cores or '?'} usable cores, "
             f"Numba {record.get('numba', '?')} ({record.get('numba_threads', '?')} threads)"]
    if noise is not None:
        lines.append(f"median IQR / median time over the sweep's points: {noise:.0%} "
                     "(rule: ≤ 5 %)")
    if above_peak:
        lines.append(f"{above_peak} sweep point(s) above 100 % of the GEMM peak: the peak was "
                     "measured too low")
    number = (f"load {max(loads):.1f} on {cores} cores (rule: ≤ {BUSY_LOAD_PER_CORE * cores:g})"
              if loads and cores else "load not recorded")
    return Card("Machine and noise", verdict, tone, number, "machine", lines)


def cards(*, agreement=None, sweep=None, fits=None, sections=(), record=None,
          meta=None) -> list[Card]:
    """The summary's cards from what a results folder holds (any part may be missing).

    Parameters
    ----------
    agreement : DataFrame, optional
        ``agreement.csv``.
    sweep, fits : DataFrame, optional
        The sweep table and its scaling fits (:func:`attnbench.studies.scaling.scaling_table`).
    sections : list of Section
        The saved sections; the stability (anchor ``stability``), parameter (``params``)
        and claims (``claims``) tables are read from them.
    record, meta : dict, optional
        ``machine.json`` and ``sweep.json``.
    """
    tables = {s.anchor: s.tables[0][1] for s in sections if s.anchor and s.tables}
    found = [agreement_card(agreement, sweep)]
    if fits is not None and not fits.empty:
        (forward, _), (backward, _) = variants.split_directions(fits, None)
        found += _fit_cards(forward, "time", None, "O(L²) time: {backend}", "scaling")
        found += _fit_cards(forward, "memory", ["numba"], "O(L) memory of the fused kernel",
                            "scaling")
        found += _fit_cards(backward, "time", None, "Backward O(L²) time: {backend}",
                            "scaling")
        found += _fit_cards(backward, "memory", ["numba"],
                            "Backward O(L) memory of the fused kernel", "scaling")
        found += _fit_cards(variants.select(fits, "forward", "window"), "time", None,
                            "Sliding window O(L·W) time: {backend}", "variants",
                            variable=WINDOW_VARIABLE)
        found += _fit_cards(variants.select(fits, "forward", "none", "decode"), "time", None,
                            "Decode O(Lk) time: {backend}", "kinds")
        found += _fit_cards(variants.select(fits, "forward", "none", "varlen"), "time", None,
                            "Packed batch O(L²) time: {backend}", "kinds")
    skipping = skipping_card(sweep)
    if skipping is not None:
        found.append(skipping)
    for card in (stability_card(tables.get("stability")), params_card(tables.get("params")),
                 claims_card(tables.get("claims")),
                 machine_card(record or {}, meta or {}, sweep)):
        if card is not None:
            found.append(card)
    return found


def render_cards(found: list[Card]) -> str:
    """The cards as HTML: ``<div class="cards">`` of ``<a class="card tone-...">``."""
    parts = ['<div class="cards">']
    for card in found:
        tone = card.tone if card.tone in TONES else "none"
        lines = "".join(f"<li>{html.escape(line)}</li>" for line in card.lines)
        parts.append(
            f'<a class="card tone-{tone}" href="#{html.escape(card.link)}" '
            f'data-tone="{tone}">'
            f'<span class="question">{html.escape(card.question)}</span>'
            f'<span class="verdict">{html.escape(card.verdict)}</span>'
            f'<span class="number">{html.escape(card.number)}</span>'
            + (f"<ul>{lines}</ul>" if lines else "") + "</a>")
    parts.append("</div>")
    return "\n".join(parts)


def summary_section(found: list[Card]) -> Section:
    """The summary as the report's first section (anchor ``summary``)."""
    legend = ("Green: confirmed, holds or agrees; amber: inconclusive, a caveat, or a busy "
              "machine; red: not confirmed, does not hold or disagrees; grey: not measured. "
              "Each card links to its evidence below.")
    return Section(title="Summary", anchor="summary", text=legend,
                   html=render_cards(found))
