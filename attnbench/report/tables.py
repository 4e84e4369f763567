"""Tables of the report as HTML that fits the page: formatted numbers, verdicts coloured.

:func:`table_html` renders a DataFrame itself (not through pandas' ``to_html``) so that:

- numbers carry meaningful digits (:func:`format_number`): integers with thousands
  separators, errors and tolerances as ``1.2e-07``, everything else to 4 significant
  digits, never a raw ``repr``;
- long text (JSON, sentences) wraps in its cell instead of pushing the other columns out
  of sight (``class="long"``);
- verdict columns (:data:`VERDICT_COLUMNS`) get the tone of their word
  (:func:`attnbench.section.tone_of`), the same colours as the summary cards.

The page puts every table in a scroll box of its own with the first column sticky, so a
wide table scrolls inside its box and never hides a column off the page.

:func:`claims_filter` adds verdict filters above the claims ledger: radio buttons that the
page's stylesheet reads with ``:has()`` (no script).
"""

from __future__ import annotations

import html
import math
import re

import pandas as pd

from attnbench.section import tone_of

__all__ = ["ERROR_COLUMNS", "VERDICT_COLUMNS", "claims_filter", "format_number", "table_html"]

#: Columns whose words are verdicts: their cells are coloured by tone.
VERDICT_COLUMNS = ("outcome", "verdict", "status", "ok", "agree", "within_tolerance")
#: Columns of errors (shown in scientific notation, 2 digits).
ERROR_COLUMNS = re.compile(r"(^|_)(err|error|abs_err|max_abs_err|tolerance|tol)($|_)")
#: Text longer than this wraps in its cell (class "long").
LONG_TEXT = 40


def format_number(value, column: str = "") -> str:
    """A number as a reader wants it: ``2,362,368``; ``1.5e-7`` for errors; else 4 digits.

    >>> format_number(2362368.0), format_number(0.99999999999999978)
    ('2,362,368', '1')
    >>> format_number(1.48e-7, "max_abs_err")
    '1.5e-7'
    """
    if value is None or isinstance(value, bool):
        return "" if value is None else ("yes" if value else "no")
    value = float(value)
    if math.isnan(value):
        return ""
    if math.isinf(value):
        return "∞" if value > 0 else "−∞"
    if ERROR_COLUMNS.search(column) and value != 0:
        mantissa, exponent = f"{value:.1e}".split("e")
        return f"{mantissa}e{int(exponent)}"
    if value == int(value) and abs(value) < 1e15:
        return f"{int(value):,}"
    magnitude = abs(value)
    if magnitude >= 1e9 or magnitude < 1e-3:
        mantissa, exponent = f"{value:.3e}".split("e")
        return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
    decimals = max(0, 3 - math.floor(math.log10(magnitude)))  # 4 significant digits
    text = f"{value:,.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _cell(value, column: str) -> str:
    classes = []
    if isinstance(value, bool) or (hasattr(value, "dtype") and str(value.dtype) == "bool"):
        text = "yes" if bool(value) else "no"
    elif isinstance(value, int | float) and not isinstance(value, bool) or (
            hasattr(value, "dtype") and getattr(value.dtype, "kind", "") in "iuf"):
        text = format_number(value, column)
        classes.append("num")
    elif value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        text = ""
    else:
        text = str(value)
        if len(text) > LONG_TEXT:
            classes.append("long")
    if column in VERDICT_COLUMNS and text:
        tone = tone_of(value if isinstance(value, str) else text)
        if tone != "none":
            classes.append(f"tone-{tone}")
    attr = f' class="{" ".join(classes)}"' if classes else ""
    return f"<td{attr}>{html.escape(text)}</td>"


def table_html(table: pd.DataFrame) -> str:
    """A table as HTML: its ready-made ``attrs["html"]``, or rendered cell by cell.

    ``attrs["html_id"]`` and ``attrs["html_class"]`` give the table's id and class.
    """
    ready = table.attrs.get("html")
    if ready:
        return str(ready)
    classes = " ".join(["data"] + ([table.attrs["html_class"]]
                                   if table.attrs.get("html_class") else []))
    table_id = table.attrs.get("html_id")
    head = "".join(f"<th>{html.escape(str(column))}</th>" for column in table.columns)
    rows = []
    columns = [str(column) for column in table.columns]
    for values in table.itertuples(index=False, name=None):
        rows.append("<tr>" + "".join(_cell(value, column)
                                     for value, column in zip(values, columns, strict=True))
                    + "</tr>")
    id_attr = f' id="{html.escape(table_id)}"' if table_id else ""
    return (f'<table{id_attr} class="{classes}"><thead><tr>{head}</tr></thead>'
            f"<tbody>\n" + "\n".join(rows) + "\n</tbody></table>")


def claims_filter(ledger_html: str) -> str:
    """Verdict filters (radio buttons, CSS only) for a table of rows with ``data-verdict``."""
    verdicts = re.findall(r'<tr [^>]*data-verdict="([^"]+)"', ledger_html)
    counts = {word: verdicts.count(word) for word in dict.fromkeys(verdicts)}
    options = [("all", f"all ({len(verdicts)})")] + [(w, f"{w} ({n})") for w, n in counts.items()]
    return ('<div class="filter">Show: ' + " ".join(
        f'<label><input type="radio" name="claims-filter" id="claims-filter-{html.escape(w)}"'
        f'{" checked" if w == "all" else ""}> {html.escape(label)}</label>'
        for w, label in options) + "</div>")


def claims_filter_css(words=("holds", "holds-with-caveat", "does-not-hold", "error")) -> str:
    """The stylesheet rules that make :func:`claims_filter`'s buttons hide rows."""
    return "\n".join(
        f'body:has(#claims-filter-{w}:checked) #claims-table tbody tr:not([data-verdict="{w}"])'
        " { display: none; }" for w in words)
