"""Sphinx extension: the figures of the documentation, made by the docs build from small runs.

Nothing here is pasted: at ``builder-inited`` each figure is computed on this machine and
written to ``docs/_generated/`` (not committed), where the pages include it.  The runs are
small and on one thread (20 s on 2 cores with Numba's cache warm, a minute or two cold), so
the figures show what the code does, not the measured results of ``docs/results.md``: those
come from ``attnbench run`` and ``attnbench bench`` on a quiet machine.

- ``scaling.png``: a short sweep of the numba backend and plain NumPy against L, no mask and
  causal, with the fitted power laws and their 95 % bands (the report's scaling figure);
- ``skipping.png``: sliding windows and documents against the plain call (block skipping's
  speed-up against density, beside the ideal);
- ``stability.png``: the softmax-stability study (entropy and Jacobian norm against d_k,
  with and without the 1/sqrt(d_k) scaling);
- ``heatmap.png``: attention weights of a tiny model, with padding and a causal mask.

Each figure's page says how it was made; the build prints the machine and the time taken.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

os.environ.setdefault("MPLBACKEND", "Agg")

#: Where the figures go (``docs/_generated``, beside the pages that include them).
OUT = Path(__file__).resolve().parents[1] / "_generated"


def _save(figure, name: str) -> Path:
    path = OUT / name
    figure.savefig(path, dpi=110)
    return path


def _sweep_table(grids, max_time: float):
    from attnbench.sweep.grid import expand
    from attnbench.sweep.run import run_sweep

    result = run_sweep(expand(grids), max_time=max_time, progress=False, threads=1,
                       with_machine=False, check_threads=False, remeasure_budget=0.0)
    return result.table


def scaling_png() -> Path:
    """A short sweep against L and its fits: the report's time-against-L figure."""
    from attnbench.report.plots import time_vs_length
    from attnbench.studies.scaling import scaling_table
    from attnbench.sweep.grid import Grid

    lengths = (256, 416, 640, 1024, 1600, 2560)
    table = _sweep_table([Grid(L=lengths, d_k=(32,), heads=(2,), mask=("none", "causal"),
                               backend=("numba", "numpy"))], max_time=0.05)
    figure = time_vs_length(table, scaling_table(table, quantities=("time",)))
    return _save(figure, "scaling.png")


def skipping_png() -> Path:
    """Sliding windows and documents beside the plain call: block skipping's speed-up."""
    from attnbench.report.variants import skipping_figure
    from attnbench.studies.variants import skipping_table
    from attnbench.sweep.grid import Grid

    table = _sweep_table([
        Grid(L=(2048, 4096), d_k=(32,), heads=(2,), mask=("causal",),
             variant=("none", "window-64"), backend=("numba",)),
        Grid(L=(2048, 4096), d_k=(32,), heads=(2,), variant=("none", "documents-8"),
             backend=("numba",)),
    ], max_time=0.05)
    return _save(skipping_figure(skipping_table(table)), "skipping.png")


def stability_png() -> Path:
    """The softmax-stability study against d_k, scaled and unscaled."""
    from attnbench.studies.stability import scaling_figure, scaling_study

    return _save(scaling_figure(scaling_study()), "stability.png")


def heatmap_png() -> Path:
    """Attention weights of a tiny model: padding, then padding and a causal mask."""
    from attnbench.report.heatmaps import attention_heatmaps

    return _save(attention_heatmaps(), "heatmap.png")


FIGURES = (scaling_png, skipping_png, stability_png, heatmap_png)


def make_figures(app=None) -> list[Path]:
    """Write every figure of :data:`FIGURES` to :data:`OUT`; returns their paths.

    Parameters
    ----------
    app : sphinx.application.Sphinx, optional
        Given when called by Sphinx (``builder-inited``); unused.

    Returns
    -------
    list of pathlib.Path
    """
    OUT.mkdir(exist_ok=True)
    made, started = [], time.perf_counter()
    for make in FIGURES:
        made.append(make())
    print(f"attnbench figures: {len(made)} made in {time.perf_counter() - started:.0f} s "
          f"({os.cpu_count()} CPUs) -> {OUT}")
    return made


def setup(app):
    """Register :func:`make_figures` to run before the pages are read.

    Parameters
    ----------
    app : sphinx.application.Sphinx

    Returns
    -------
    dict
        The extension's metadata.
    """
    app.connect("builder-inited", make_figures)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
