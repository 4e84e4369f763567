"""Attention heat maps of a short English sentence: no mask, causal, padding.

:func:`heatmap_weights` computes the weights with ``kernels.attention(...,
return_weights=True)``, :func:`attention_heatmaps` draws them side by side and
:func:`heatmap_section` is the report's section, with what the weights show measured on
them (nothing above the causal diagonal, nothing on a pad key, rows that sum to 1).
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from attnbench.section import Section

__all__ = ["SENTENCE", "attention_heatmaps", "heatmap_section", "heatmap_weights"]


#: The example sentence of the heat maps.
SENTENCE = "The cat sat on the mat because it was tired"


def heatmap_weights(sentence: str = SENTENCE, *, d_model: int = 16, n_pad: int = 3,
                    seed: int = 0) -> list[tuple[str, list[str], np.ndarray]]:
    """Attention weights of one head over a short sentence: no mask, causal, padding.

    The sentence is split into words; each distinct word gets a random embedding
    (d_model entries, seeded), queries and keys are the embeddings times random
    projections W_Q, W_K, and the weights come from
    ``kernels.attention(..., return_weights=True)``.  The padding panel appends
    ``n_pad`` "<pad>" tokens and passes ``key_lengths`` = the number of words: no
    query may attend to a pad.

    Returns
    -------
    list of (title, tokens, weights (L, L))
    """
    from attnbench import kernels

    words = sentence.lower().split()
    padded = words + ["<pad>"] * n_pad
    rng = np.random.default_rng(seed)
    vocabulary = {word: index for index, word in enumerate(dict.fromkeys(padded))}
    embeddings = rng.standard_normal((len(vocabulary), d_model))  # (V, d_model)
    w_q = rng.standard_normal((d_model, d_model)) / np.sqrt(d_model)
    w_k = rng.standard_normal((d_model, d_model)) / np.sqrt(d_model)

    def weights(tokens, **kwargs):
        x = embeddings[[vocabulary[t] for t in tokens]]  # (L, d_model)
        _, w = kernels.attention(x @ w_q, x @ w_k, x, return_weights=True, **kwargs)
        return w  # (L, L)

    return [
        ("no mask", words, weights(words)),
        ("causal (query i sees keys j ≤ i)", words, weights(words, causal=True)),
        (f"padding ({n_pad} <pad> keys, key_lengths={len(words)})", padded,
         weights(padded, key_lengths=len(words))),
    ]


def attention_heatmaps(panels=None) -> Figure:
    """Heat maps of :func:`heatmap_weights` (computed if not given), side by side."""
    panels = heatmap_weights() if panels is None else panels
    fig = Figure(figsize=(5.4 * len(panels), 5.6), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (title, tokens, w) in zip(axes, panels, strict=True):
        image = ax.imshow(w, cmap="viridis", vmin=0, vmax=1)
        ax.set_xticks(range(len(tokens)), tokens, rotation=60, ha="right", fontsize=8)
        ax.set_yticks(range(len(tokens)), tokens, fontsize=8)
        ax.set(xlabel="key", ylabel="query", title=title)
    fig.colorbar(image, ax=axes, shrink=0.8, label="attention weight")
    return fig


def heatmap_section() -> list[Section]:
    """The report's section with :func:`attention_heatmaps` and what the weights show."""
    panels = heatmap_weights()
    (_, words, full), (_, _, causal), (_, padded, padding) = panels
    n = len(words)
    above_diagonal = float(np.max(causal[np.triu_indices(n, k=1)]))
    on_pads = float(np.max(padding[:, n:]))
    row_sums = np.concatenate([w.sum(axis=-1) for _, _, w in panels])
    text = (f'Attention weights of one head on "{SENTENCE}": random word embeddings '
            "(16 entries, seed 0) and random query/key projections, computed with "
            "kernels.attention(..., return_weights=True) on the default backend. Each row "
            "is a query, each column a key.\n\n"
            f"Measured on these weights: the largest causal weight above the diagonal is "
            f"{above_diagonal:g}; the largest weight on a <pad> key is {on_pads:g} (the pad "
            "rows still attend to the words: a padding mask hides keys, not queries); "
            f"row sums differ from 1 by at most {np.abs(row_sums - 1).max():.1e}; the largest "
            f"weight without a mask is {full.max():.3f}.")
    return [Section(title="Attention heat maps", text=text,
                    figures=[("Attention weights on an example sentence",
                              attention_heatmaps(panels))])]
