"""The ``attnbench`` command (also ``python -m attnbench``): one module per subcommand.

In the manner of asv's ``commands/``: each subcommand's module declares its arguments
(an ``add_<name>`` function) and holds the handler that does the command's work, the
function that orchestrates the library's layers below, prints and returns the exit
status (``<name>_command``): :mod:`~attnbench.cli.run` (the main job),
:mod:`~attnbench.cli.sweep` and :mod:`~attnbench.cli.bench` time;
:mod:`~attnbench.cli.report`, :mod:`~attnbench.cli.verify`, :mod:`~attnbench.cli.params`
and :mod:`~attnbench.cli.compare` read results or compute without timing;
:mod:`~attnbench.cli.conformance` holds ``conform``.  Two modules serve them:
:mod:`~attnbench.cli.arguments` (the argument types they share) and
:mod:`~attnbench.cli.console` (what ``run`` and ``sweep`` print of a sweep).  Nothing
below this package imports it.
"""

from __future__ import annotations

import argparse
import sys

from attnbench import __version__
from attnbench.cli import bench, compare, conformance, params, report, run, sweep, verify

__all__ = ["COMMANDS", "build_parser", "main"]


#: Subcommands: name -> function adding its parser.
COMMANDS = {"run": run.add_run, "sweep": sweep.add_sweep, "report": report.add_report,
            "verify": verify.add_verify, "params": params.add_params, "bench": bench.add_bench,
            "compare": compare.add_compare, "conform": conformance.add_conform}


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
