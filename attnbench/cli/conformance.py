"""The ``conform`` subcommand: the conformance battery on any attention implementation."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["add_conform"]


def _spec(text: str) -> str:
    from attnbench.measure.specs import check_spec

    try:
        return check_spec(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value < 2**32:
        raise argparse.ArgumentTypeError(f"expected an integer seed in [0, 2**32), got {text!r}")
    return value


def add_conform(subparsers) -> None:
    from attnbench.conformance.runner import DEFAULT_TIMEOUT
    from attnbench.measure.specs import CONVENTIONS

    parser = subparsers.add_parser(
        "conform", help="verify and benchmark any attention implementation",
        description=(
            "Run the conformance battery on each IMPL, whose calls run in a process of its "
            "own while the problems, the oracle, the comparisons and the clock stay in "
            "this one: correctness (agreement with the float64 oracle on a table of named "
            "cases and on problems drawn from the run's seed, in float32 and float64; hidden "
            "keys and values never read; future tokens never seen; large logits; output "
            "shape and dtype; inputs untouched, a fresh output, no result cached between "
            "calls, correct after many calls and after being timed; gradients), determinism "
            "(repeated calls, thread counts, batch mates), conventions (observed: fully "
            "masked rows, causal alignment, dropout, LSE, float64 compute) and speed (time "
            "against L, GFLOP/s, fitted exponent, ratio to numba). Prints a property x "
            "implementation matrix and the seed. IMPL is reference, numba, cuda, numpy, "
            "torch (SDPA), jax (jax.nn.dot_product_attention), a name registered under the "
            "'attnbench.implementations' entry-point group, or module:function. Exit "
            "status: 0 if every implementation conforms, 1 if one fails a correctness "
            "property (or determinism with --deterministic) or could not be run (raised, "
            "hung, crashed), 2 on a usage error."),
    )
    parser.add_argument("implementations", metavar="IMPL", nargs="+", type=_spec,
                        help="implementations to check")
    parser.add_argument("--convention", choices=CONVENTIONS, default=None,
                        help="how to call the module:function IMPLs (default: kernels; named "
                             "implementations keep their own)")
    parser.add_argument("--backward", metavar="SPEC", type=_spec,
                        help="module:function of the backward of the module:function IMPLs "
                             "(kernels convention: kernels.attention_backward's signature)")
    parser.add_argument("--json", metavar="FILE", type=Path, help="write the results as JSON")
    parser.add_argument("--out", metavar="DIR", type=Path,
                        help="write DIR/conformance.html (and DIR/conformance.json)")
    parser.add_argument("--quick", action="store_true", help="skip the speed section")
    parser.add_argument("--deterministic", action="store_true",
                        help="determinism failures fail the verdict too")
    parser.add_argument("--seed", metavar="N", type=_seed, default=None,
                        help="the seed of the drawn problems and of every check's values "
                             "(default: a new one each run, printed and stored in the JSON; "
                             "give it to replay a run)")
    parser.add_argument("--timeout", metavar="S", type=_seconds, default=DEFAULT_TIMEOUT,
                        help="seconds each implementation may take (default: %(default)g)")
    parser.set_defaults(handler=_conform)


def _conform(args) -> int:
    from attnbench.conformance import render
    from attnbench.conformance.runner import conform, exit_status, new_seed

    if args.backward and ":" not in args.backward:
        print("attnbench conform: --backward takes module:function", file=sys.stderr)
        return 2

    def progress(entry):
        print(f"  {entry['name']}: {entry['verdict']} ({entry['seconds']:.1f} s)",
              file=sys.stderr, flush=True)

    seed = new_seed() if args.seed is None else args.seed
    print(f"seed {seed} (--seed {seed} replays this run's problems)", file=sys.stderr,
          flush=True)
    report = conform(args.implementations, convention=args.convention,
                     backward=args.backward, quick=args.quick,
                     deterministic=args.deterministic, timeout=args.timeout, seed=seed,
                     progress=progress)
    print(render.report_text(report))
    if args.json:
        print(f"wrote {render.write_json(report, args.json)}")
    if args.out:
        render.write_json(report, args.out / "conformance.json")
        print(f"wrote {render.write_html(report, args.out)}")
    return exit_status(report)
