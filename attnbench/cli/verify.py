"""The ``verify`` command: every claim of the source articles checked, the claims ledger.

:func:`add_verify` declares the arguments; :func:`verify_command` runs the ledger
(:func:`attnbench.claims.ledger.verify_claims`), prints it as text or JSON, and tells a
check that raised apart from a claim that does not hold: the first is an exit status of 1,
the second a verdict like any other.
"""

from __future__ import annotations

import sys
import time

from attnbench.claims.ledger import format_ledger, ledger_json, verify_claims
from attnbench.claims.rules import ERROR

__all__ = ["add_verify", "verify_command"]


def add_verify(subparsers) -> None:
    parser = subparsers.add_parser(
        "verify", help="check every claim of the source articles: the claims ledger",
        description=(
            "Run the claims ledger: each claim C01-C31 of the source articles is measured "
            "or computed and gets a verdict decided from the numbers (holds, "
            "holds-with-caveat with its condition, or does-not-hold). Prints one block per "
            "claim with the measured values, or a JSON list with --json. A few seconds on 2 "
            "cores; the timing claims (C12, C27, C29) depend on machine load. Exit status: "
            "0 if every check ran (whatever the verdicts), 1 if a check raised, 2 for an "
            "unknown claim id."),
    )
    parser.add_argument("--only", nargs="+", metavar="ID",
                        help="check only these claims, e.g. --only C03 C23 (default: all)")
    parser.add_argument("--json", action="store_true",
                        help="print a JSON list of objects (id, claim, source, verdict, "
                             "measured, condition, details, seconds, values)")
    parser.add_argument("--details", action="store_true",
                        help="also print how each claim was measured")
    parser.set_defaults(handler=verify_command)


def verify_command(args) -> int:
    """``attnbench verify``: run the ledger, print it (text or JSON); 1 if a check errored."""
    start = time.perf_counter()
    try:
        ledger = verify_claims(args.only)
    except ValueError as exc:
        print(f"attnbench verify: error: {exc}", file=sys.stderr)
        return 2
    elapsed = time.perf_counter() - start
    if args.json:
        print(ledger_json(ledger))
    else:
        print(format_ledger(ledger, details=args.details))
        print(f"Ledger run time: {elapsed:.1f} s.")
    errors = ledger[ledger["verdict"] == ERROR]
    for row in errors.itertuples():
        print(f"attnbench verify: check {row.id} raised: {row.measured}", file=sys.stderr)
    return 1 if len(errors) else 0
