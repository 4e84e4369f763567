"""The unit a report is made of: a titled section with text, tables and figures.

Every part of the harness that contributes to the HTML report (sweeps and scaling,
the softmax-stability study, parameter arithmetic, the claims ledger) returns
``Section`` objects; :mod:`attnbench.report.html` renders a list of them.  Keeping
the hand-over this small lets each part be built and tested on its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd


@dataclass
class Section:
    """One section of the report."""

    title: str  # heading, e.g. "Scaling with sequence length"
    text: str = ""  # paragraphs of plain text (blank lines separate paragraphs)
    tables: list[tuple[str, pd.DataFrame]] = field(default_factory=list)  # (caption, table)
    figures: list[tuple[str, object]] = field(default_factory=list)  # (caption, matplotlib Figure)
    anchor: str = ""  # HTML id; derived from the title when empty

    def slug(self) -> str:
        """The section's HTML id."""
        if self.anchor:
            return self.anchor
        return "".join(c if c.isalnum() else "-" for c in self.title.lower()).strip("-")
