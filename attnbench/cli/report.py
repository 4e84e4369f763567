"""The ``report`` command: the HTML report of a results folder, rebuilt without measuring.

:func:`add_report` declares the arguments; :func:`report_command` renders the page with
:func:`attnbench.report.build.build_report` from the files ``attnbench run`` or
``attnbench sweep`` wrote, and prints which command wrote each of them
(:func:`attnbench.report.build.provenance`), so that a reader knows what the page shows.
"""

from __future__ import annotations

import sys
from pathlib import Path

from attnbench.report.build import build_report, provenance

__all__ = ["add_report", "report_command"]


def add_report(subparsers) -> None:
    parser = subparsers.add_parser(
        "report", help="rebuild the HTML report from saved results, without re-running",
        description=(
            "Render FOLDER/report.html from the files 'attnbench run' or 'attnbench sweep' "
            "wrote there: agreement.csv, sweep.parquet or sweep.csv (the scaling fits are "
            "recomputed from its rows), sections/ (heat maps and studies as they were "
            "computed) and machine.json. Nothing is measured again. Prints which command "
            "wrote each file it read (the page's subtitle says it too); a few seconds. "
            "Exit status: 0, or 2 if FOLDER holds no results."),
    )
    parser.add_argument("folder", metavar="FOLDER", type=Path, nargs="?",
                        default=Path("reports"),
                        help="the results folder (default: %(default)s)")
    parser.add_argument("--html", metavar="FILE", type=Path,
                        help="where to write the page (default: FOLDER/report.html)")
    parser.set_defaults(handler=report_command)


def report_command(args) -> int:
    """``attnbench report DIR [--html FILE]``."""
    try:
        path = build_report(args.folder, args.html)
    except FileNotFoundError as exc:
        print(f"attnbench report: error: {exc}", file=sys.stderr)
        return 2
    print(f"Read {args.folder}:")
    for line in provenance(args.folder):
        print(f"  {line}")
    print(f"Wrote {path}")
    return 0
