"""Measured gradients of the stability study: ‖dQ‖ and ‖dK‖ with and without 1/√d_k.

:func:`gradient_study` draws, for each head size d_k, queries, keys, values and an output
gradient with independent unit-variance entries (seeded), runs the backward pass
:func:`kernels.attention_backward` once with the default scale ``1/√d_k`` and once with
``scale=1`` (the unscaled variant), and records the row norms of dQ and dK.  These are
the gradients a training step would apply, so they answer the sources' claim (C15: a
saturated softmax shrinks the gradients) directly, where the Jacobian norms of
:func:`attnbench.studies.stability.scaling_study` answer it for the weights alone.

A query row's gradient counts as *vanishing* when its norm is below
:data:`VANISHING_FRACTION` of the median row norm of the scaled variant at the same d_k
(the size a well-spread row's gradient has there).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from attnbench import kernels

__all__ = ["VANISHING_FRACTION", "gradient_figure", "gradient_study", "gradient_summary"]

#: A row's gradient vanishes when its norm is below this fraction of the scaled median.
VANISHING_FRACTION = 0.01


def gradient_study(d_k_values, *, n_queries: int = 256, n_keys: int = 128, d_v: int = 64,
                   seed: int = 0, backend: str = "numba") -> pd.DataFrame:
    """Row norms of dQ and dK through :func:`kernels.attention_backward`, scaled or not.

    Parameters
    ----------
    d_k_values : iterable of int
        Head sizes.
    n_queries, n_keys : int
        Queries (rows of dQ) and keys (rows of dK, the length of each softmax).
    d_v : int
        Head size of the values and of the output gradient.
    seed : int
        One generator for the whole study, drawn in the order of ``d_k_values``.
    backend : str, default "numba"
        Backend of the forward (``out``, ``lse``) and of the backward, float64 inputs.

    Returns
    -------
    DataFrame
        One row per (d_k, scaled): ``dq_norm_mean``, ``dq_norm_median``, ``dk_norm_mean``,
        ``dk_norm_median`` (Euclidean norms of the rows of dQ and dK),
        ``dq_vanishing_fraction`` (rows of dQ below :data:`VANISHING_FRACTION` of the
        scaled variant's median at that d_k), with ``L`` and ``scale``.
    """
    rng = np.random.default_rng(seed)
    rows = []
    for d_k in d_k_values:
        q = rng.standard_normal((n_queries, d_k))
        k = rng.standard_normal((n_keys, d_k))
        v = rng.standard_normal((n_keys, d_v))
        dout = rng.standard_normal((n_queries, d_v))
        norms = {}
        for scaled in (True, False):  # scaled first: its median sets the vanishing line
            scale = 1 / np.sqrt(d_k) if scaled else 1.0
            out, lse = kernels.attention(q, k, v, scale=scale, return_lse=True,
                                         backend=backend)
            dq, dk, _ = kernels.attention_backward(q, k, v, dout, out=out, lse=lse,
                                                   scale=scale, backend=backend)
            norms[scaled] = (np.linalg.norm(dq, axis=-1), np.linalg.norm(dk, axis=-1), scale)
        line = VANISHING_FRACTION * np.median(norms[True][0])
        for scaled in (False, True):
            dq_rows, dk_rows, scale = norms[scaled]
            rows.append({
                "d_k": d_k, "scaled": scaled, "L": n_keys, "scale": scale,
                "dq_norm_mean": float(dq_rows.mean()),
                "dq_norm_median": float(np.median(dq_rows)),
                "dk_norm_mean": float(dk_rows.mean()),
                "dk_norm_median": float(np.median(dk_rows)),
                "dq_vanishing_fraction": float((dq_rows < line).mean()),
            })
    return pd.DataFrame(rows)


def gradient_figure(gradients: pd.DataFrame, jacobian: pd.DataFrame | None = None):
    """Median row norms of dQ and dK against d_k, scaled and not (and the Jacobian norm)."""
    from matplotlib.figure import Figure

    panels = [("dq_norm_median", "‖dQ row‖ (median)"), ("dk_norm_median", "‖dK row‖ (median)")]
    if jacobian is not None:
        panels.append(("jacobian_fro_median", "‖diag(p) − ppᵀ‖_F (median)"))
    fig = Figure(figsize=(3.7 * len(panels), 3.4), layout="constrained")
    axes = fig.subplots(1, len(panels))
    for ax, (column, label) in zip(axes, panels, strict=True):
        data = jacobian if column.startswith("jacobian") else gradients
        for scaled, style in ((True, "o-"), (False, "s--")):
            part = data[data["scaled"] == scaled]
            ax.plot(part["d_k"], part[column].clip(lower=1e-300), style,
                    label="q·k/√d_k" if scaled else "q·k (unscaled)")
        ax.set(xscale="log", yscale="log", xlabel="d_k")
        ax.set_xscale("log", base=2)
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle("Gradients through kernels.attention_backward (q, k, v, dout entries ~ N(0, 1))",
                 fontsize=11)
    return fig


def gradient_summary(gradients: pd.DataFrame) -> str:
    """One sentence on the measured gradients, with their numbers."""
    raw = gradients[~gradients["scaled"]].set_index("d_k")
    scaled = gradients[gradients["scaled"]].set_index("d_k")
    lo, hi = raw.index.min(), raw.index.max()
    return (f"Measured through the backward kernel: the median ‖dQ‖ of a query row goes from "
            f"{raw.loc[lo, 'dq_norm_median']:.3g} (unscaled) and "
            f"{scaled.loc[lo, 'dq_norm_median']:.3g} (scaled) at d_k = {lo} to "
            f"{raw.loc[hi, 'dq_norm_median']:.3g} and {scaled.loc[hi, 'dq_norm_median']:.3g} "
            f"at d_k = {hi}; {raw.loc[hi, 'dq_vanishing_fraction']:.0%} of unscaled rows "
            f"(scaled: {scaled.loc[hi, 'dq_vanishing_fraction']:.0%}) fall below "
            f"{VANISHING_FRACTION:g} of the scaled median there; median ‖dK‖ "
            f"{raw.loc[hi, 'dk_norm_median']:.3g} unscaled against "
            f"{scaled.loc[hi, 'dk_norm_median']:.3g} scaled.")
