"""``attnbench bench``'s outputs: the console tables, Markdown, the plot and the files."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from attnbench.bench.config import COLUMNS, FLOOR
from attnbench.bench.interval_targets import INCONCLUSIVE
from attnbench.measure.machine import machine_columns, summary_lines
from attnbench.report.html import write_html
from attnbench.section import Section

# --- output -----------------------------------------------------------------------------------

#: Columns printed for the timing sections, with their headers.
_SHOWN = {"section": "section", "impl": "impl", "variant": "variant", "L": "L", "D": "D",
          "causal": "causal", "dtype": "dtype", "status": "status", "median_ms": "median ms",
          "iqr_ms": "IQR ms", "gflops": "GFLOP/s", "pct_of_gemm_peak": "% peak",
          "vs_torch": "/torch", "vs_numpy": "/numpy", "max_abs_err": "max|err|",
          "tolerance": "tol", "extra_mib": "extra MiB", "rss_extra_mib": "RSS MiB",
          "load_1m": "load"}


def format_table(table: pd.DataFrame) -> str:
    """The bench table as fixed-width text (statuses other than ok shortened)."""
    shown = table[list(_SHOWN)].copy()
    shown["causal"] = shown["causal"].map({True: "yes", False: ""})
    shown["status"] = shown["status"].str.slice(0, 40)
    formats = {"median_ms": "{:.3f}", "iqr_ms": "{:.3f}", "gflops": "{:.1f}",
               "pct_of_gemm_peak": "{:.0f}", "vs_torch": "{:.2f}", "vs_numpy": "{:.3f}",
               "max_abs_err": "{:.1e}", "tolerance": "{:.1e}", "extra_mib": "{:.1f}",
               "rss_extra_mib": "{:.1f}", "load_1m": "{:.1f}"}
    for column, fmt in formats.items():
        shown[column] = shown[column].map(lambda x, f=fmt: "" if x != x else f.format(x))
    return shown.rename(columns=_SHOWN).to_string(index=False)


def format_targets(targets: pd.DataFrame) -> str:
    shown = targets.copy()
    shown["met"] = shown["met"].map({True: "met", False: "MISSED", None: "n/a",
                                      INCONCLUSIVE: INCONCLUSIVE})
    return shown.to_string(index=False)


def _markdown(frame: pd.DataFrame) -> str:
    """A DataFrame as a GitHub-flavoured Markdown table (cells as they are)."""
    lines = ["| " + " | ".join(map(str, frame.columns)) + " |",
             "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


def format_markdown(table: pd.DataFrame, targets: pd.DataFrame, meta: dict,
                    command_line: str = "") -> str:
    """The speed section and the targets as Markdown, with the machine and the command.

    This is what the README's performance section shows (pasted from ``bench.md``).
    """
    speed = table[(table["section"] == "speed") & (table["status"] == "ok")]
    by_impl = speed.set_index(["L", "causal", "impl"])
    numba = speed[speed["impl"] == "numba"].set_index(["L", "causal"])
    rows = []
    for (L, causal), ratio in numba.iterrows():
        def ms(impl, L=L, causal=causal):
            if (L, causal, impl) not in by_impl.index:
                return ""
            row = by_impl.loc[(L, causal, impl)]
            return f"{row['median_ms']:.1f} ({row['iqr_ms']:.1f})"
        rows.append({"L": int(L), "causal": "yes" if causal else "",
                     "numba ms (IQR)": ms("numba"), "torch ms (IQR)": ms("torch"),
                     "numpy ms (IQR)": ms("numpy"), "GEMMs alone ms (IQR)": ms(FLOOR),
                     "numba / torch": "" if ratio["vs_torch"] != ratio["vs_torch"]
                     else f"{ratio['vs_torch']:.2f}",
                     "numba / numpy": "" if ratio["vs_numpy"] != ratio["vs_numpy"]
                     else f"{ratio['vs_numpy']:.2f}",
                     "numba % of GEMM peak": f"{ratio['pct_of_gemm_peak']:.0f}"})
    machine, config = meta["machine"], meta["config"]
    peaks = meta["gemm_peak_gflops"]["used"]
    blas = machine_columns(machine)["blas"]
    seconds = meta["seconds"]
    took = f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"
    torch = f"torch {machine['torch']}" if machine.get("torch") else "torch not installed"
    header = (
        f"`{command_line or 'attnbench bench'}` ({took}), on {machine['cpu_model']} "
        f"({machine['usable_cores']} cores), {meta['threads']} threads for numba and each "
        f"peer; Numba {machine['numba']} ({machine['numba_threading_layer']} layer), "
        f"{torch}, NumPy {machine['numpy']}; BLAS {blas}. Float32 GEMM peak measured in the "
        f"run: {peaks['float32']:.0f} GFLOP/s. Load average {meta['load_average'][0]:.2f} "
        f"before, {meta['load_average'][1]:.2f} after. B={config['batch']}, "
        f"H={config['heads']}, D={config['head_size']}, float32; medians of interleaved "
        f"rounds (interquartile range in brackets); \"GEMMs alone\" is numba's two tile "
        f"GEMMs without the softmax (the floor under its time).")
    shown_targets = targets.assign(met=targets["met"].map({True: "met", False: "**missed**",
                                                           None: "n/a",
                                                           INCONCLUSIVE: INCONCLUSIVE}))
    shown_targets = shown_targets.fillna("")
    return "\n\n".join([header, _markdown(pd.DataFrame(rows)),
                         _markdown(shown_targets[["target", "measured", "goal", "met", "note"]])]
                        ) + "\n"


def plot(table: pd.DataFrame):
    """Time against L per implementation (causal dashed), and numba's ratios to the peers."""
    speed = table[(table["section"] == "speed") & (table["status"] == "ok")]
    figure = Figure(figsize=(11, 4.2), layout="constrained")
    left, right = figure.subplots(1, 2)
    colors = {"numba": "tab:blue", "torch": "tab:orange", "numpy": "tab:green",
              FLOOR: "tab:grey"}
    for (impl, causal), rows in speed.groupby(["impl", "causal"]):
        rows = rows.sort_values("L")
        left.errorbar(rows["L"], rows["median_ms"],
                      yerr=[rows["median_ms"] - rows["q25_ms"], rows["q75_ms"] - rows["median_ms"]],
                      color=colors.get(impl), linestyle="--" if causal else "-", marker="o",
                      label=f"{impl}{' (numba tile GEMMs alone)' if impl == FLOOR else ''}"
                            f"{' causal' if causal else ''}")
    left.set(xscale="log", yscale="log", xlabel="L", ylabel="median time (ms)",
             title="B=1 H=12 D=64 float32")
    numba_rows = speed[speed["impl"] == "numba"]
    for peer, goal in (("torch", 0.8), ("numpy", 0.33)):
        for causal, rows in numba_rows.groupby("causal"):
            rows = rows.sort_values("L").dropna(subset=["vs_" + peer])
            if len(rows):
                right.plot(rows["L"], rows["vs_" + peer], color=colors[peer], marker="o",
                           linestyle="--" if causal else "-",
                           label=f"numba / {peer}{' causal' if causal else ''}")
        right.axhline(goal, color=colors[peer], linewidth=0.8, linestyle=":")
    right.axhline(1, color="grey", linewidth=0.8)
    right.set(xscale="log", yscale="log", xlabel="L", ylabel="time ratio (< 1: numba faster)",
              title="numba against its peers (dotted: targets)")
    for ax in (left, right):  # no speed rows (--only backward ...): no legend either
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    lengths = sorted(speed["L"].unique())
    for ax in (left, right):  # ticks at the measured lengths, plainly labelled
        ax.set_xticks(lengths, [str(L) for L in lengths])
        ax.minorticks_off()
    return figure


def write_results(table: pd.DataFrame, targets: pd.DataFrame, meta: dict, out_dir,
                  *, command_line: str = "") -> list[Path]:
    """Write bench.csv, targets.csv, machine.json, bench.png, bench.html and bench.md."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / name for name in ("bench.csv", "targets.csv", "machine.json",
                                         "bench.png", "bench.html", "bench.md")]
    table.to_csv(paths[0], index=False)
    targets.to_csv(paths[1], index=False)
    paths[2].write_text(json.dumps({**meta, "command": command_line}, indent=2, default=str)
                        + "\n")
    figure = plot(table)
    figure.savefig(paths[3], dpi=100)
    machine = "\n".join(summary_lines(meta["machine"]))
    peaks = meta["gemm_peak_gflops"]
    text = (f"Command: {command_line or 'attnbench bench'}\n\n{machine}\n\n"
            f"GEMM peak (numpy matmul n=1024, {meta['threads']} threads): float32 "
            f"{peaks['used']['float32']:.1f} GFLOP/s (before {peaks['before']['float32']:.1f}, "
            f"after {peaks['after']['float32']:.1f}); float64 {peaks['used']['float64']:.1f}. "
            f"Run took {meta['seconds']:.0f} s; load average {meta['load_average'][0]:.2f} "
            f"before, {meta['load_average'][1]:.2f} after.")
    shown = table[list(COLUMNS)]
    sections = [
        Section("Targets", text, tables=[("One verdict per target", targets)]),
        Section("Measurements", "Medians of interleaved rounds; ratios are numba's time "
                "over the peer's on the same inputs in the same round sequence.",
                tables=[("Every row", shown)], figures=[("Time and ratios against L", figure)]),
    ]
    write_html(paths[4], sections, title="attnbench bench",
               subtitle=f"{meta['machine']['cpu_model']}, {meta['threads']} threads.")
    paths[5].write_text(format_markdown(table, targets, meta, command_line))
    return paths
