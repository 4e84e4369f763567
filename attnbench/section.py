"""The unit a report is made of: a titled section with text, tables and figures.

Every part of the harness that contributes to the HTML report (sweeps and scaling,
the softmax-stability study, parameter arithmetic, the claims ledger) returns
``Section`` objects; :mod:`attnbench.report.html` renders a list of them.  Keeping
the hand-over this small lets each part be built and tested on its own.

Verdict colours are decided here, once, for the whole report: :func:`tone_of` maps a
verdict word of any part (a fit's outcome, a claim's verdict, agreement) to a tone, and
:data:`TONES` gives each tone its background colour.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

#: Tone -> background colour: the same in the summary cards, the tables and the ledger.
TONES = {"ok": "#d4f4dd", "warn": "#fff1c2", "bad": "#f9d0d0", "none": "#e8e8e8"}

#: Verdict words (lower case) of every part of the harness -> tone.
_WORDS = {
    "ok": ("confirmed", "holds", "agree", "all agree", "ok", "true", "yes", "quiet",
           "within"),
    "warn": ("inconclusive", "holds-with-caveat", "caveat", "skipped", "busy", "measured"),
    "bad": ("not confirmed", "does-not-hold", "disagree", "failed", "error", "false", "no",
            "outside"),
}


def tone_of(word) -> str:
    """The tone of a verdict word: ``"ok"``, ``"warn"``, ``"bad"`` or ``"none"``.

    >>> tone_of("not confirmed"), tone_of("holds-with-caveat"), tone_of(True)
    ('bad', 'warn', 'ok')
    """
    text = str(word).strip().lower()
    for tone, words in _WORDS.items():
        if text in words:
            return tone
    return "none"


@dataclass
class Section:
    """One section of the report."""

    title: str  # heading, e.g. "Scaling with sequence length"
    text: str = ""  # paragraphs of plain text (blank lines separate paragraphs)
    tables: list[tuple[str, pd.DataFrame]] = field(default_factory=list)  # (caption, table)
    figures: list[tuple[str, object]] = field(default_factory=list)  # (caption, matplotlib Figure)
    anchor: str = ""  # HTML id; derived from the title when empty
    html: str = ""  # ready-made HTML shown after the text (the summary's cards)

    def slug(self) -> str:
        """The section's HTML id."""
        if self.anchor:
            return self.anchor
        return "".join(c if c.isalnum() else "-" for c in self.title.lower()).strip("-")
