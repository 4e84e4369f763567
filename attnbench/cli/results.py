"""The subcommands that read results or compute without timing: ``report``, ``verify``,
``params`` and ``compare``.

Each is a ``add_<name>`` function declaring its arguments; the work is done by the
function its parser's ``handler`` names.
"""

from __future__ import annotations

from pathlib import Path

from attnbench import compare
from attnbench.claims import ledger
from attnbench.report import build as report_build
from attnbench.studies import params

__all__ = ["add_compare", "add_params", "add_report", "add_verify"]


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
    parser.set_defaults(handler=_report)


def _report(args) -> int:
    return report_build.command(args)


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
    parser.set_defaults(handler=_verify)


def _verify(args) -> int:
    return ledger.command(args)


def add_params(subparsers) -> None:
    parser = subparsers.add_parser(
        "params", help="parameter counts of named or custom Transformer configurations",
        description=(
            "Count parameters from formulas, by group: attention (W_Q, W_K, W_V, W_O and "
            "biases), MLP, norms, embeddings (token + position + token type) and head "
            "(untied LM head, BERT pooler), with each model's published total and the "
            "difference, and the attention count checked against a real "
            "kernels.MultiHeadAttention where it fits in memory. Named configurations: "
            "bert-base, bert-large, gpt2-small, gpt3-175b, llama2-70b, tinyllama-1.1b. A "
            "custom configuration takes --d-model, --layers, --heads, --d-ff and --vocab "
            "(and optionally the others); it follows GPT-2's layout (biases, LayerNorm, "
            "GELU MLP, learned positions, tied head) unless told otherwise. With no "
            "argument, every named configuration. Exit status: 0, or 2 for a bad "
            "configuration."),
    )
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help="named configurations, e.g. bert-base gpt3-175b")
    parser.add_argument("--all", action="store_true", help="every named configuration")
    custom = parser.add_argument_group("custom configuration")
    for flag, help_text in (("--d-model", "model width"), ("--layers", "Transformer blocks"),
                            ("--heads", "query heads"),
                            ("--kv-heads", "key/value heads (GQA; default: --heads)"),
                            ("--d-ff", "MLP hidden width"), ("--vocab", "vocabulary size"),
                            ("--max-len", "learned positions (0: none, e.g. RoPE; default 0)"),
                            ("--type-vocab", "token-type embeddings (BERT: 2; default 0)")):
        custom.add_argument(flag, type=int, metavar="N", help=help_text)
    custom.add_argument("--mlp", choices=("gelu", "swiglu"),
                        help="gelu: 2 matrices with biases (default); swiglu: 3 matrices")
    custom.add_argument("--norm", choices=("layernorm", "rmsnorm"),
                        help="layernorm: weight + bias (default); rmsnorm: weight only")
    custom.add_argument("--no-bias", action="store_true",
                        help="no biases on the attention and MLP projections")
    custom.add_argument("--untied-head", action="store_true",
                        help="an LM head of its own (vocab x d_model)")
    custom.add_argument("--name", default="custom", help="row label (default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="print the table as JSON")
    parser.add_argument("--csv", metavar="FILE", type=Path, help="also write the table here")
    parser.set_defaults(handler=_params)


def _params(args) -> int:
    return params.command(args)


def add_compare(subparsers) -> None:
    parser = subparsers.add_parser(
        "compare", help="compare two result folders: ratios with intervals, CI exit status",
        description=(
            "Compare the sweeps of two result folders (two commits, two machines, before and "
            "after): for every point measured in both, the ratio of the medians B / A with a "
            "95%% bootstrap interval over the samples, and whether the change is significant "
            "(the whole interval on one side of 1). Writes OUT/compare.csv and compare.png. "
            "Exit status: 0, 1 if a point regressed (the whole interval above 1 + "
            "THRESHOLD), 2 if a folder holds no sweep or the two share no point."),
    )
    parser.add_argument("before", metavar="A", type=Path, help="the baseline results folder")
    parser.add_argument("after", metavar="B", type=Path, help="the results folder to judge")
    parser.add_argument("--threshold", type=float, default=0.10,
                        help="relative slow-down a significant change must exceed to be a "
                             "regression (default: %(default)s)")
    parser.add_argument("--quantity", choices=("time", "cpu"), default="time",
                        help="wall-clock time or process CPU time (default: %(default)s)")
    parser.add_argument("--out", type=Path,
                        help="where to write compare.csv and compare.png (default: B/compare)")
    parser.set_defaults(handler=_compare)


def _compare(args) -> int:
    return compare.command(args)
