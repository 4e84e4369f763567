"""Parameter arithmetic: attention, MLP, embedding and total counts from formulas.

Each named configuration is a :class:`ModelConfig` whose fields say what a model has
(biases, which norm, which MLP, tied or untied output head, learned positions...);
:func:`count_parameters` turns one into a breakdown from closed-form formulas.  What is
counted, per group (all layers together):

- ``attention``: W_Q (d_model x H·d_head), W_K and W_V (d_model x Hkv·d_head, GQA), W_O
  (H·d_head x d_model), plus their biases when ``bias`` (the layout of
  :class:`kernels.MultiHeadAttention`).
- ``mlp``: two matrices d_model x d_ff and d_ff x d_model with biases (``"gelu"``), or three
  without (``"swiglu"``: gate, up, down, as LLaMA).
- ``norms``: every LayerNorm (weight and bias: 2·d_model) or RMSNorm (weight: d_model):
  two per layer, the final one (pre-LN models) and the one after the embeddings (BERT).
- ``embeddings``: token embeddings (vocab x d_model), learned positions (max_len x
  d_model; 0 with rotary positions) and token types (BERT's segment embeddings).
- ``head``: what sits on top: an untied LM head (vocab x d_model; 0 when tied to the
  token embeddings) and BERT's pooler (d_model² + d_model).

Dropout, rotary tables and attention masks hold no parameters.  The attention count is
cross-checked against :meth:`kernels.MultiHeadAttention.num_parameters`, built for real
where one layer's weights fit in :data:`MAX_REAL_ATTENTION_PARAMS` (and counted from the
shapes alone where they do not, e.g. GPT-3: 604 M parameters per layer).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd

from attnbench.section import Section

__all__ = [
    "CONFIGS",
    "MAX_REAL_ATTENTION_PARAMS",
    "ModelConfig",
    "attention_params_per_layer",
    "count_parameters",
    "get_config",
    "parameter_table",
    "section",
]

#: Largest per-layer attention built for real as kernels.MultiHeadAttention (float32:
#: 4 bytes each, so 200 MB); bigger ones are counted from their shapes only.
MAX_REAL_ATTENTION_PARAMS = 50_000_000


@dataclass(frozen=True)
class ModelConfig:
    """A Transformer's shape, and what it has besides the shape."""

    name: str  # e.g. "bert-base"
    d_model: int  # width of the residual stream
    n_layers: int  # Transformer blocks
    n_heads: int  # query heads; d_head = d_model // n_heads
    d_ff: int  # hidden width of the MLP
    vocab_size: int  # token embedding rows
    max_len: int = 0  # learned position embeddings (0: none, e.g. rotary positions)
    n_kv_heads: int | None = None  # key/value heads (GQA); None: n_heads
    type_vocab: int = 0  # token-type (segment) embeddings: BERT has 2
    bias: bool = True  # biases on the attention and MLP projections
    mlp: str = "gelu"  # "gelu": 2 matrices with biases; "swiglu": 3 matrices (gate, up, down)
    norm: str = "layernorm"  # "layernorm" (weight + bias) or "rmsnorm" (weight only)
    final_norm: bool = True  # a norm after the last block (pre-LN models: GPT-2, LLaMA)
    embedding_norm: bool = False  # a LayerNorm right after the embeddings (BERT)
    tied_head: bool = True  # LM head shares the token embedding matrix (no extra parameters)
    pooler: bool = False  # BERT's pooler: d_model x d_model + bias
    published_total: float | None = None  # the published parameter count
    published_source: str = ""  # where that number comes from

    def __post_init__(self):
        for name in ("d_model", "n_layers", "n_heads", "d_ff", "vocab_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
                raise ValueError(f"{name} must be a positive int; got {value!r}")
        for name in ("max_len", "type_vocab"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0; got {getattr(self, name)!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} must be divisible by "
                             f"n_heads={self.n_heads}")
        if self.kv_heads < 1 or self.n_heads % self.kv_heads:
            raise ValueError(f"n_heads={self.n_heads} must be a multiple of "
                             f"n_kv_heads={self.n_kv_heads}")
        if self.mlp not in ("gelu", "swiglu"):
            raise ValueError(f"mlp={self.mlp!r}; expected 'gelu' or 'swiglu'")
        if self.norm not in ("layernorm", "rmsnorm"):
            raise ValueError(f"norm={self.norm!r}; expected 'layernorm' or 'rmsnorm'")

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads


#: The named configurations, with the published totals they are compared with.
CONFIGS: dict[str, ModelConfig] = {
    config.name: config for config in (
        ModelConfig(
            "bert-base", d_model=768, n_layers=12, n_heads=12, d_ff=3072, vocab_size=30522,
            max_len=512, type_vocab=2, final_norm=False, embedding_norm=True, pooler=True,
            published_total=109_482_240,
            published_source="bert-base-uncased as Hugging Face's BertModel (pooler "
                              "included); the BERT paper rounds it to 110M"),
        ModelConfig(
            "bert-large", d_model=1024, n_layers=24, n_heads=16, d_ff=4096, vocab_size=30522,
            max_len=512, type_vocab=2, final_norm=False, embedding_norm=True, pooler=True,
            published_total=340e6,
            published_source="Devlin et al. 2019 (BERT), rounded to 340M"),
        ModelConfig(
            "gpt2-small", d_model=768, n_layers=12, n_heads=12, d_ff=3072, vocab_size=50257,
            max_len=1024, published_total=124_439_808,
            published_source="gpt2 as Hugging Face's GPT2Model; the LM head is tied to the "
                             "token embeddings"),
        ModelConfig(
            "gpt3-175b", d_model=12288, n_layers=96, n_heads=96, d_ff=49152, vocab_size=50257,
            max_len=2048, published_total=175.0e9,
            published_source="Brown et al. 2020, Table 2.1 (175.0B; d_model 12288, 96 "
                             "layers, 96 heads of 128, context 2048); GPT-2 layout and a "
                             "tied head assumed"),
        ModelConfig(
            "llama2-70b", d_model=8192, n_layers=80, n_heads=64, n_kv_heads=8, d_ff=28672,
            vocab_size=32000, max_len=0, bias=False, mlp="swiglu", norm="rmsnorm",
            tied_head=False, published_total=70e9,
            published_source="Touvron et al. 2023 (Llama 2), nominal 70B; shape from its "
                             "config.json: hidden 8192, intermediate 28672, 80 layers, 64 "
                             "heads, 8 KV heads, vocab 32000, untied head, RoPE"),
        ModelConfig(
            "tinyllama-1.1b", d_model=2048, n_layers=22, n_heads=32, n_kv_heads=4, d_ff=5632,
            vocab_size=32000, max_len=0, bias=False, mlp="swiglu", norm="rmsnorm",
            tied_head=False, published_total=1.1e9,
            published_source="TinyLlama-1.1B (Zhang et al. 2024), nominal 1.1B; a small "
                             "LLaMA-2-style GQA model (32 heads, 4 KV heads)"),
    )
}


def get_config(name: str) -> ModelConfig:
    """A named configuration (case-insensitive; ``_`` and ``-`` are the same)."""
    key = name.lower().replace("_", "-")
    if key not in CONFIGS:
        raise ValueError(f"unknown configuration {name!r}; expected one of "
                         f"{', '.join(CONFIGS)}")
    return CONFIGS[key]


def attention_params_per_layer(config: ModelConfig) -> int:
    """W_Q, W_K, W_V, W_O (and biases) of one layer, as kernels.MultiHeadAttention has them."""
    d, q_width = config.d_model, config.n_heads * config.d_head
    kv_width = config.kv_heads * config.d_head
    weights = d * q_width + 2 * d * kv_width + q_width * d
    biases = (q_width + 2 * kv_width + d) if config.bias else 0
    return weights + biases


def _mlp_params_per_layer(config: ModelConfig) -> int:
    d, f = config.d_model, config.d_ff
    if config.mlp == "swiglu":
        return 3 * d * f + ((2 * f + d) if config.bias else 0)
    return 2 * d * f + ((f + d) if config.bias else 0)


def _norm_params(config: ModelConfig) -> int:
    return (2 if config.norm == "layernorm" else 1) * config.d_model


def count_parameters(config: ModelConfig) -> dict:
    """Parameter counts of ``config`` by group, from the formulas in the module docstring.

    Returns
    -------
    dict
        ``attention_per_layer``, ``attention``, ``mlp``, ``norms``, ``embeddings``
        (``token_embeddings``, ``position_embeddings``, ``type_embeddings``), ``head``
        (``lm_head``, ``pooler``), ``total``, the attention share of the total and of
        the non-embedding parameters, and the published total with the difference.
    """
    nan = float("nan")
    d, layers = config.d_model, config.n_layers
    attention_layer = attention_params_per_layer(config)
    token = config.vocab_size * d
    position = config.max_len * d
    types = config.type_vocab * d
    norms_count = 2 * layers + int(config.final_norm) + int(config.embedding_norm)
    lm_head = 0 if config.tied_head else config.vocab_size * d
    pooler = d * d + d if config.pooler else 0
    groups = {
        "attention": attention_layer * layers,
        "mlp": _mlp_params_per_layer(config) * layers,
        "norms": norms_count * _norm_params(config),
        "embeddings": token + position + types,
        "head": lm_head + pooler,
    }
    total = sum(groups.values())
    embedding_like = groups["embeddings"] + lm_head
    row = {
        "config": config.name, "d_model": d, "layers": layers, "heads": config.n_heads,
        "kv_heads": config.kv_heads, "d_head": config.d_head, "d_ff": config.d_ff,
        "vocab": config.vocab_size, "max_len": config.max_len,
        "attention_per_layer": attention_layer, **groups,
        "token_embeddings": token, "position_embeddings": position, "type_embeddings": types,
        "lm_head": lm_head, "pooler": pooler, "total": total,
        "attention_share": groups["attention"] / total,
        "attention_share_non_embedding": groups["attention"] / (total - embedding_like),
        "published_total": nan if config.published_total is None else config.published_total,
        "difference": nan if config.published_total is None
        else total - config.published_total,
        "difference_pct": nan if config.published_total is None
        else 100.0 * (total - config.published_total) / config.published_total,
        "published_source": config.published_source,
    }
    return row


def cross_check_attention(config: ModelConfig, *, max_real: int = MAX_REAL_ATTENTION_PARAMS
                          ) -> dict:
    """One layer's attention count from :class:`kernels.MultiHeadAttention` vs the formula.

    Built for real (float32 arrays, then dropped) when the formula's count is at most
    ``max_real``; otherwise only the formula is available and the row says so.

    Returns
    -------
    dict
        ``mha_parameters`` (int, or None when not built), ``mha_matches`` (bool or None)
        and ``mha_check`` (a sentence for the table).
    """
    formula = attention_params_per_layer(config)
    if formula > max_real:
        megabytes = formula * 4 / 2**20
        return {"mha_parameters": None, "mha_matches": None,
                "mha_check": f"not built: one layer's attention would take "
                             f"{megabytes:,.0f} MiB; counted from shapes only"}
    from attnbench import kernels

    layer = kernels.MultiHeadAttention(config.d_model, config.n_heads, config.kv_heads,
                                       bias=config.bias)
    built = layer.num_parameters()
    del layer
    same = built == formula
    return {"mha_parameters": built, "mha_matches": same,
            "mha_check": f"kernels.MultiHeadAttention: {built:,} "
                         f"{'=' if same else '!='} formula {formula:,}"}


def parameter_table(configs=None, *, cross_check: bool = True) -> pd.DataFrame:
    """One row per configuration: the breakdown, the cross-check and the published total.

    Parameters
    ----------
    configs : iterable of ModelConfig or str, optional
        Default: every entry of :data:`CONFIGS`.
    cross_check : bool, default True
        Build kernels.MultiHeadAttention where it fits (see :func:`cross_check_attention`).
    """
    configs = CONFIGS.values() if configs is None else configs
    rows = []
    for config in configs:
        config = get_config(config) if isinstance(config, str) else config
        row = count_parameters(config)
        if cross_check:
            row.update(cross_check_attention(config))
        rows.append(row)
    return pd.DataFrame(rows)


def custom_config(name: str = "custom", **fields) -> ModelConfig:
    """A :class:`ModelConfig` from keyword fields (GPT-2 layout unless told otherwise)."""
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = set(fields) - known
    if unknown:
        raise ValueError(f"unknown configuration fields: {sorted(unknown)}")
    return ModelConfig(name=name, **fields)


# --- presentation ---------------------------------------------------------------------------

#: Columns of the printed / reported table.
DISPLAY_COLUMNS = ["config", "d_model", "layers", "heads", "kv_heads", "d_ff",
                   "attention_per_layer", "attention", "mlp", "norms", "embeddings", "head",
                   "total", "published_total", "difference_pct", "attention_share"]


def format_table(table: pd.DataFrame) -> str:
    """The parameter table as fixed-width text (counts with thousands separators)."""
    shown = table[[c for c in DISPLAY_COLUMNS if c in table]].copy()

    def count(value):
        return "" if pd.isna(value) else f"{int(value):,}"

    formatters = {c: count for c in ("attention_per_layer", "attention", "mlp", "norms",
                                     "embeddings", "head", "total", "published_total")}
    formatters["difference_pct"] = lambda v: "" if pd.isna(v) else f"{v:+.2f}%"
    formatters["attention_share"] = lambda v: f"{100 * v:.1f}%"
    text = shown.to_string(index=False, formatters=formatters, na_rep="")
    notes = []
    for row in table.itertuples():
        if "mha_check" in table:
            notes.append(f"{row.config}: attention per layer, {row.mha_check}")
        if row.published_source:
            notes.append(f"{row.config}: published total from {row.published_source}")
    return text + ("\n\n" + "\n".join(notes) if notes else "")


def breakdown_figure(table: pd.DataFrame):
    """Stacked horizontal bars: each configuration's parameters by group, as % of its total."""
    from matplotlib.figure import Figure

    groups = ["attention", "mlp", "norms", "embeddings", "head"]
    colours = ["#d62728", "#1f77b4", "#7f7f7f", "#2ca02c", "#ff7f0e"]
    fig = Figure(figsize=(8, 0.6 * len(table) + 1.5), layout="constrained")
    ax = fig.add_subplot()
    left = np.zeros(len(table))
    labels = [f"{row.config} ({row.total / 1e6:,.1f}M)" if row.total < 1e9
              else f"{row.config} ({row.total / 1e9:,.2f}B)" for row in table.itertuples()]
    for group, colour in zip(groups, colours, strict=True):
        share = 100.0 * table[group].to_numpy(float) / table["total"].to_numpy(float)
        ax.barh(labels, share, left=left, color=colour, label=group)
        for y, (x0, width) in enumerate(zip(left, share, strict=True)):
            if width >= 6:
                ax.text(x0 + width / 2, y, f"{width:.0f}%", ha="center", va="center",
                        color="white", fontsize=8)
        left += share
    ax.set_xlim(0, 100)
    ax.set_xlabel("share of all parameters (%)")
    ax.invert_yaxis()
    ax.legend(ncols=5, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    ax.set_title("Where the parameters are", pad=28)
    return fig


def section(table: pd.DataFrame | None = None) -> Section:
    """The report's parameter-arithmetic section: the table and the breakdown bars."""
    table = parameter_table() if table is None else table
    shown = table[[c for c in DISPLAY_COLUMNS if c in table]
                  + [c for c in ("mha_check", "published_source") if c in table]]
    text = (
        "Parameter counts from closed-form formulas. attention: W_Q, W_K, W_V, W_O and "
        "their biases (GQA: W_K and W_V have n_kv_heads·d_head columns); mlp: two matrices "
        "with biases (GELU) or three without (SwiGLU); norms: every LayerNorm (weight and "
        "bias) or RMSNorm (weight); embeddings: token + learned position + token-type; "
        "head: an untied LM head and BERT's pooler. The attention count per layer is "
        "checked against kernels.MultiHeadAttention built for real where one layer fits "
        f"in {MAX_REAL_ATTENTION_PARAMS // 1_000_000}M parameters (GPT-3 and LLaMA-2-70B: "
        "from shapes only). attention_share is the attention's share of all parameters; "
        "the share of the non-embedding parameters is in the CSV."
    )
    return Section(title="Parameter arithmetic", text=text, anchor="params",
                   tables=[("Parameter counts by group, with published totals", shown)],
                   figures=[("Parameters by group (share of each model's total)",
                             breakdown_figure(table))])
