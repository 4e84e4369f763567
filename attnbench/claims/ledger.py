"""The claims ledger: every claim of the source articles as a measured verdict.

The 31 claims (ids C01–C31, as in ``docs/claims.md``, which names each source
article) are listed in :data:`CLAIMS`; :data:`SOURCES` gives each source's title.
Each has a check function (in :mod:`attnbench.claims.softmax`,
:mod:`attnbench.claims.attention`, :mod:`attnbench.claims.masking` and
:mod:`attnbench.claims.cost`) that measures or
computes what the claim is about and returns a :class:`Result`: the measured value(s),
and a verdict decided from them by an explicit rule written in the check's docstring —
never by hand.  The verdicts:

- ``holds``: the measurement agrees with the claim under the rule.
- ``holds-with-caveat``: it agrees only under a condition, which the ``condition``
  column states with the numbers that show it (e.g. "only in exact arithmetic: float32
  weights are exactly 0 once a logit is 103.97 below the maximum").
- ``does-not-hold``: the measurement contradicts the claim.
- ``error``: the check itself raised; the message is recorded and the ledger goes on.

How a stated number is compared (the rules the checks share, in :mod:`attnbench.claims.rules`):

- A number quoted to some precision ("4.7", "28.3M", "[0.73, 0.05, 0.22]") matches a
  measured value when the measured value rounds to it (within half a unit of the last
  quoted digit).
- "about X" for a ratio or a share matches within ±15 %.
- Timing ratios come from calls interleaved in the same run: medians of several samples
  per function, as single-thread CPU time for the claims about cost.  They still vary
  between runs and machines, so their verdicts are the only ones in the ledger that can
  differ; each such check keeps its judging rule in a separate pure function, tested with
  injected numbers.

:func:`verify_claims` runs the checks (all of them in a few seconds on 2 cores) and
returns the ledger as a DataFrame; :func:`section` turns it into the report's section.
"""

from __future__ import annotations

import html
import json
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from attnbench.claims import attention as att
from attnbench.claims import cost, masking
from attnbench.claims import softmax as sm
from attnbench.claims.rules import ABOUT_RELATIVE, CAVEAT, ERROR, FAILS, HOLDS, VERDICTS, Result
from attnbench.section import TONES, Section, tone_of

__all__ = [
    "CLAIMS",
    "COLUMNS",
    "Claim",
    "Result",
    "SOURCES",
    "format_ledger",
    "ledger_html",
    "ledger_json",
    "section",
    "verify_claims",
]

#: Source number -> the article's title (an English translation; docs/claims.md has the
#: original titles).
SOURCES = {
    "000": "Inside the Transformer (2): softmax and self-attention",
    "001": "What is attention?",
    "002": "3-2 Self-attention: the Transformer's core operation",
    "004": "Understanding BERT #4: self-attention",
}


def source_titles(source: str) -> str:
    """``"000, 002"`` -> the titles of those articles, one per line, numbers kept."""
    return "\n".join(f"{number} {SOURCES.get(number, '')}".strip()
                     for number in (part.strip() for part in source.split(",")) if number)


@dataclass(frozen=True)
class Claim:
    """One claim of the sources, with the function that checks it."""

    id: str  # "C01" ... "C31": stable across versions
    source: str  # which seed texts make it ("000, 002")
    text: str  # the claim in the project's words, as in docs/claims.md
    check: Callable[[], Result]


def _claims() -> dict[str, Claim]:
    table = [
        ("C01", "000, 002", "softmax maps any real vector to values in (0, 1) that sum to "
         "exactly 1", sm.c01),
        ("C02", "000", "softmax(x/T): raising the temperature T makes the distribution more "
         "uniform, lowering it makes it more peaked (entropy rises monotonically with T)",
         sm.c02),
        ("C03", "000", "e^10 − e^9 ≈ 12,000 while e^2 − e^1 ≈ 4.7; the two output differences "
         "differ by \"more than about 2,500×\"", sm.c03),
        ("C04", "000", "q_i · k_j = e_iᵀ W_Qᵀ W_K e_j: W_Qᵀ W_K acts as a learned bilinear "
         "similarity between embeddings", att.c04),
        ("C05", "000", "in column convention (Q, K ∈ R^{d_k×n}, V ∈ R^{d_v×n}) attention is "
         "written softmax(KᵀQ/√d_k)·V, and this equals the row-convention "
         "softmax(QKᵀ/√d_k)V", att.c05),
        ("C06", "000, 001, 002, 004", "the variance of q·k grows with d_k; dividing by √d_k "
         "keeps the softmax from saturating", sm.c06),
        ("C07", "000", "a causal mask (−∞ on future positions before softmax) makes those "
         "weights exactly 0, so no future token can change an earlier token's output",
         masking.c07),
        ("C08", "000, 004", "a padding mask keeps PAD positions from contributing to any "
         "output", masking.c08),
        ("C09", "000", "GPT-3 has 96 heads, and each head's W_Q and W_K are 128 × 12,288 "
         "matrices", cost.c09),
        ("C10", "000", "with the low-rank value map (value-down then value-up), value "
         "parameters ≈ query parameters + key parameters", cost.c10),
        ("C11", "000", "self-attention holds about 1/3 of a Transformer's parameters; MLP and "
         "the rest hold about 2/3", cost.c11),
        ("C12", "000, 002, 004", "the cost of attention grows as O(n²) in the sequence "
         "length n", cost.c12),
        ("C13", "000", "the residual update E' = E + ΔE keeps the representation's shape and "
         "lets the update be added to the embedding", att.c13),
        ("C14", "001", "cosine similarity lies in [−1, 1]: 1 same direction, 0 unrelated, −1 "
         "opposite", sm.c14),
        ("C15", "001, 002", "without the √d_k scaling the softmax becomes nearly one-hot and "
         "its gradients become vanishingly small", sm.c15),
        ("C16", "001", "softmax raises contrast compared with plain normalisation s_i / Σ s_j",
         sm.c16),
        ("C17", "001, 004", "multi-head attention with d_k = d_model / n_heads: concatenating "
         "the heads gives back d_model, and one big projection + reshape + batched attention "
         "+ reshape equals the per-head loop + concat", att.c17),
        ("C18", "001", "the concat of heads costs nothing: it is only a reshape of the "
         "batched result", cost.c18),
        ("C19", "001", "in the one-block example (attention → residual + LayerNorm → FFN → "
         "residual + LayerNorm), every output row has mean 0 and variance 1 across features",
         att.c19),
        ("C20", "002", "every row of the attention weight matrix A = softmax(S') sums to 1",
         att.c20),
        ("C21", "002", "raw attention scores are not probabilities; only the softmaxed "
         "weights are", sm.c21),
        ("C22", "004", "with Q = K = X (no projections) every token attends most to itself, "
         "because a vector's dot product with itself is always the largest", att.c22),
        ("C23", "004", "the scores Q·K = [0.9, 0.1, 0.3] become the softmax weights "
         "[0.73, 0.05, 0.22]", sm.c23),
        ("C24", "004", "d_head = 768 / 12 = 64 and the scale is √64 = 8", cost.c24),
        ("C25", "004", "adding −1e9 to PAD scores makes their probability \"practically 0\" "
         "after softmax", masking.c25),
        ("C26", "004", "dropout (p = 0.1) on the attention probabilities randomly switches "
         "off attention links during training", masking.c26),
        ("C27", "004", "12 heads of 64 dimensions cost the same as one 768-dimensional "
         "attention", cost.c27),
        ("C28", "004", "BERT-base attention: W_Q, W_K, W_V, W_O are 768 × 768 each: "
         "2,359,296 parameters per layer without bias, 2,362,368 with bias, 28.3M for 12 "
         "layers", cost.c28),
        ("C29", "004", "cutting max_length from 512 to 192 makes attention about 7× faster, "
         "because the cost is L²", cost.c29),
        ("C30", "004", "self-attention without position information is position-invariant: "
         "permuting the tokens only permutes the outputs", att.c30),
        ("C31", "000", "masking with −∞ and softmax: e^−∞ = 0, so the masked weight is "
         "exactly 0 (also in float32 arithmetic)", masking.c31),
    ]
    return {cid: Claim(cid, source, text, check) for cid, source, text, check in table}


#: id -> Claim, in id order.
CLAIMS: dict[str, Claim] = _claims()


# --- the ledger ------------------------------------------------------------------------------

#: Columns of the ledger DataFrame, in order.
COLUMNS = ["id", "claim", "source", "verdict", "measured", "condition", "details", "seconds",
           "values"]


def _normalise_ids(only: Iterable[str] | None) -> list[str]:
    if only is None:
        return list(CLAIMS)
    ids = []
    for item in only:
        cid = str(item).strip().upper()
        number = cid.removeprefix("C")
        if number.isdigit():
            cid = f"C{int(number):02d}"
        if cid not in CLAIMS:
            raise ValueError(f"unknown claim id {item!r}; expected C01 ... C{len(CLAIMS):02d}")
        ids.append(cid)
    return ids


def verify_claims(only: Iterable[str] | None = None) -> pd.DataFrame:
    """Run the checks and return the ledger, one row per claim.

    Parameters
    ----------
    only : iterable of str, optional
        Claim ids ("C03", "c3" or "3"); default: all of them.

    Returns
    -------
    DataFrame
        Columns :data:`COLUMNS`: ``id``, ``claim``, ``source``, ``verdict``, ``measured``,
        ``condition``, ``details``, ``seconds`` (the check's run time) and ``values`` (a
        dict of the numbers).  A check that raises gets verdict ``error`` and its message in
        ``measured``; the other checks still run.

    Raises
    ------
    ValueError
        An unknown id in ``only``.
    """
    rows = []
    for cid in _normalise_ids(only):
        claim = CLAIMS[cid]
        start = time.perf_counter()
        try:
            result = claim.check()
        except Exception as exc:  # a broken check is a row, never a crash
            result = Result(ERROR, f"{type(exc).__name__}: {exc}",
                            details="the check raised; see the message")
        rows.append({"id": cid, "claim": claim.text, "source": claim.source,
                     "verdict": result.verdict, "measured": result.measured,
                     "condition": result.condition, "details": result.details,
                     "seconds": time.perf_counter() - start, "values": result.values})
    return pd.DataFrame(rows, columns=COLUMNS)


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | np.ndarray):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.bool_ | bool):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        value = float(value)
        return value if math.isfinite(value) else str(value)
    return value


def ledger_json(ledger: pd.DataFrame) -> str:
    """The ledger as a JSON list of objects (every column; numbers in ``values``)."""
    return json.dumps([_jsonable(row) for row in ledger.to_dict(orient="records")],
                      indent=2, ensure_ascii=False)


def summary_counts(ledger: pd.DataFrame) -> str:
    """E.g. "31 claims: 12 holds, 14 holds-with-caveat, 5 does-not-hold, 0 error"."""
    counts = ledger["verdict"].value_counts()
    return f"{len(ledger)} claims: " + ", ".join(f"{int(counts.get(v, 0))} {v}"
                                                 for v in VERDICTS)


def format_ledger(ledger: pd.DataFrame, *, width: int = 100, details: bool = False) -> str:
    """The ledger as readable text: one block per claim (id, verdict, claim, measured...)."""
    import textwrap

    lines = []
    for row in ledger.itertuples():
        lines.append(f"{row.id}  {row.verdict.upper()}  [{row.source}]")
        for label, text in (("claim", row.claim), ("measured", row.measured),
                            ("condition", row.condition),
                            ("details", row.details if details else "")):
            if text:
                lines.extend(textwrap.wrap(text, width=width, initial_indent=f"     {label}: ",
                                           subsequent_indent=" " * (7 + len(label))))
        lines.append("")
    lines.append(summary_counts(ledger)
                 + f" (checks took {ledger['seconds'].sum():.1f} s)")
    return "\n".join(lines)


#: Background colour of each verdict in the report's claims table.
#: (The report's palette, :data:`attnbench.section.TONES`: one colour per tone.)
VERDICT_COLOURS = {word: TONES[tone_of(word)] for word in (HOLDS, CAVEAT, FAILS, ERROR)}


def ledger_html(ledger: pd.DataFrame) -> str:
    """The claims table as HTML: ``<table id="claims-table" class="claims">``, verdicts coloured.

    Each row has ``data-verdict`` and the verdict cell ``class="verdict verdict-<word>"``
    with an inline background, so the page needs no stylesheet and a test can find them.
    """
    head = ["id", "verdict", "claim", "measured", "condition", "source"]
    out = ['<table id="claims-table" class="claims">',
           "<thead><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead>", "<tbody>"]
    for row in ledger.itertuples():
        colour = VERDICT_COLOURS.get(row.verdict, "#ffffff")
        cells = [f"<td>{html.escape(row.id)}</td>",
                 f'<td class="verdict verdict-{html.escape(row.verdict)}" '
                 f'style="background:{colour};font-weight:bold;white-space:nowrap">'
                 f"{html.escape(row.verdict)}</td>"]
        cells += [f"<td>{html.escape(str(getattr(row, name)))}</td>"
                  for name in ("claim", "measured", "condition")]
        cells.append('<td class="source">' + "<br>".join(
            html.escape(line) for line in source_titles(row.source).splitlines()) + "</td>")
        out.append(f'<tr id="claim-{row.id}" data-verdict="{html.escape(row.verdict)}">'
                   + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


def section(ledger: pd.DataFrame | None = None) -> Section:
    """The report's claims section (``anchor="claims"``).

    Its table is the ledger without ``values``; ``table.attrs["html"]`` holds the same
    table rendered by :func:`ledger_html` (``id="claims-table" class="claims"``, verdict
    cells coloured) for a renderer that embeds ready-made HTML, and ``attrs["html_id"]``
    / ``attrs["html_class"]`` name the id and class for one that renders the DataFrame.
    """
    ledger = verify_claims() if ledger is None else ledger
    table = ledger[["id", "verdict", "claim", "measured", "condition", "source",
                    "details"]].copy()
    table.attrs.update({"html": ledger_html(ledger), "html_id": "claims-table",
                        "html_class": "claims"})
    text = (
        "Every claim of the four source articles, checked by measurement. holds: the "
        "measurement agrees under the check's rule; holds-with-caveat: only under the "
        "stated condition; does-not-hold: the measurement contradicts the claim. Numbers "
        "quoted by a source match when the measured value rounds to them; \"about X\" "
        f"matches within ±{ABOUT_RELATIVE:.0%}. Cost verdicts (C12, C18, C27, C29) come "
        "from calls interleaved in this run, timed as single-thread CPU time so that other "
        "processes on the machine do not distort them; they can still vary between runs "
        "and machines.\n\n"
        + summary_counts(ledger) + "."
    )
    return Section(title="Claims ledger", text=text, anchor="claims",
                   tables=[("The claims and their verdicts", table)])
