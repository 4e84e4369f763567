"""The ``attnbench`` command (also ``python -m attnbench``): argument parsing only.

Eight subcommands, each declared by an ``add_<name>`` function that delegates the work to
one function of the package: :mod:`~attnbench.cli.measuring` holds ``run`` (the main
job), ``sweep`` and ``bench``; :mod:`~attnbench.cli.results` holds ``report``, ``verify``,
``params`` and ``compare``; :mod:`~attnbench.cli.conformance` holds ``conform``;
:mod:`~attnbench.cli.arguments` the argument types they share.
"""

from __future__ import annotations

import argparse
import sys

from attnbench import __version__
from attnbench.cli import conformance, measuring, results

__all__ = ["COMMANDS", "build_parser", "main"]


#: Subcommands: name -> function adding its parser.
COMMANDS = {"run": measuring.add_run, "sweep": measuring.add_sweep,
            "report": results.add_report, "verify": results.add_verify,
            "params": results.add_params, "bench": measuring.add_bench,
            "compare": results.add_compare, "conform": conformance.add_conform}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``attnbench`` command, with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="attnbench",
        description="Measure and verify the attention kernels of the kernels package.",
    )
    parser.add_argument("--version", action="version", version=f"attnbench {__version__}")
    subparsers = parser.add_subparsers(title="commands", dest="command", metavar="COMMAND",
                                       required=True)
    for add in COMMANDS.values():
        add(subparsers)
    return parser


def main(argv=None) -> int:
    """Entry point of ``attnbench``: parse ``argv`` (default ``sys.argv[1:]``), run, return status.

    Parameters
    ----------
    argv : list of str, optional

    Returns
    -------
    int
        The exit status (see each command's ``--help``); 130 after Ctrl-C.
    """
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        # sweeps catch Ctrl-C themselves and keep their rows; elsewhere (the agreement
        # check, a study) a traceback would say nothing more than this line
        print(f"\nattnbench {args.command}: interrupted (Ctrl-C)", file=sys.stderr)
        return 130
