"""The ``params`` command: parameter counts of named or custom Transformer configurations.

:func:`add_params` declares the arguments; :func:`params_command` builds the
configurations they name (:data:`attnbench.studies.params.CONFIGS`) or describe (a custom
one, :func:`attnbench.studies.params.custom_config`), counts their parameters
(:func:`attnbench.studies.params.parameter_table`) and prints the table as text or JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from attnbench.studies.params import (
    CONFIGS,
    custom_config,
    format_table,
    get_config,
    parameter_table,
)

__all__ = ["CUSTOM_FLAGS", "REQUIRED_CUSTOM", "add_params", "params_command"]


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
    parser.set_defaults(handler=params_command)


#: Command-line flag -> ModelConfig field of a custom configuration.
CUSTOM_FLAGS = {"d_model": "d_model", "layers": "n_layers", "heads": "n_heads",
                "kv_heads": "n_kv_heads", "d_ff": "d_ff", "vocab": "vocab_size",
                "max_len": "max_len", "type_vocab": "type_vocab", "mlp": "mlp", "norm": "norm"}
#: Flags a custom configuration cannot do without.
REQUIRED_CUSTOM = ("d_model", "layers", "heads", "d_ff", "vocab")


def params_command(args) -> int:
    """``attnbench params``: print the table for named configs, all of them, or a custom one."""

    def fail(message):
        print(f"attnbench params: error: {message}", file=sys.stderr)
        return 2

    given = {flag: getattr(args, flag) for flag in CUSTOM_FLAGS
             if getattr(args, flag, None) is not None}
    custom_switches = args.no_bias or args.untied_head
    configs = []
    try:
        if args.all:
            configs.extend(CONFIGS.values())
        configs.extend(get_config(name) for name in args.names)
        if given or custom_switches:
            missing = [f"--{flag.replace('_', '-')}" for flag in REQUIRED_CUSTOM
                       if flag not in given]
            if missing:
                return fail(f"a custom configuration needs {', '.join(missing)} "
                            f"(given: {', '.join(sorted(given)) or 'none'})")
            fields = {CUSTOM_FLAGS[flag]: value for flag, value in given.items()}
            configs.append(custom_config(args.name, bias=not args.no_bias,
                                         tied_head=not args.untied_head, **fields))
    except ValueError as exc:
        return fail(str(exc))
    if not configs:
        configs = list(CONFIGS.values())
    table = parameter_table(configs)
    if args.json:
        records = table.astype(object).where(table.notna(), None).to_dict(orient="records")
        print(json.dumps(records, indent=2, default=lambda v: v.item()))
    else:
        print(format_table(table))
    if args.csv:
        table.to_csv(args.csv, index=False)
    return 0
