"""``attnbench bench``'s targets: one verdict per target, from the measured rows."""

from __future__ import annotations

import numpy as np
import pandas as pd

from attnbench.bench.config import FLOOR, TARGET_COLUMNS, BenchConfig
from attnbench.bench.decode import decode_targets
from attnbench.bench.interval_targets import backward_targets, variant_targets
from attnbench.bench.precision import precision_targets
from attnbench.bench.varlen import varlen_targets
from attnbench.measure.timing import fault

# --- the targets ------------------------------------------------------------------------------


def _fmt_ratio(values: pd.Series) -> str:
    return ", ".join(f"L={int(L)}: {ratio:.2f}" for L, ratio in values.items())


def targets_table(table: pd.DataFrame, config: BenchConfig) -> pd.DataFrame:
    """One row per target: what was measured, the goal and whether it is met.

    A target whose rows are missing (a peer not installed, a section skipped) has
    ``met = None`` and says why in ``note``; the backward's and the variants' targets
    (:mod:`attnbench.bench.interval_targets`) may also be ``"inconclusive"``.
    """
    quick = " (quick run: not the targets' shapes)" if config.quick else ""
    targets = []

    def add(target, shape, values, goal, met, note=""):
        targets.append({"target": target, "shape": shape, "measured": values, "goal": goal,
                        "met": met, "note": note + quick})

    if set(config.sections) - {"backward", "variants", "decode", "varlen",
                               "precision"}:  # a forward section ran
        _forward_targets(table, config, add)
    if "backward" in config.sections:
        for target in backward_targets(table, config.causal):
            add(target["target"], target["shape"], target["measured"], target["goal"],
                target["met"], target["note"])
    for target in varlen_targets(table, config) if "varlen" in config.sections else ():
        add(target["target"], target["shape"], target["measured"], target["goal"],
            target["met"], target["note"])
    if "variants" in config.sections:
        for target in variant_targets(table, config):
            add(target["target"], target["shape"], target["measured"], target["goal"],
                target["met"], target["note"])
    if "decode" in config.sections:
        for target in decode_targets(table):
            add(target["target"], target["shape"], target["measured"], target["goal"],
                target["met"], target["note"])
    if "precision" in config.sections:
        for target in precision_targets(table, config.causal):
            add(target["target"], target["shape"], target["measured"], target["goal"],
                target["met"], target["note"])
    return pd.DataFrame(targets, columns=list(TARGET_COLUMNS))


def _forward_targets(table: pd.DataFrame, config: BenchConfig, add) -> None:
    """The forward's targets, each passed to ``add(target, shape, values, goal, met, note)``."""
    ok = table["status"] == "ok"
    speed = table[(table["section"] == "speed") & ok]
    numba_speed = speed[speed["impl"] == "numba"]
    floor = speed[speed["impl"] == FLOOR].set_index("L")

    def floor_note(peer, lengths):
        """The floor's ratio to ``peer``: the lowest ratio a kernel on these GEMMs can reach."""
        ratios = floor["vs_" + peer].dropna() if len(floor) else pd.Series(dtype=float)
        ratios = ratios[ratios.index.isin(lengths)]
        if not len(ratios):
            return ""
        return (f"numba's tile GEMMs alone (softmax left out) / {peer}, non-causal: "
                f"{_fmt_ratio(ratios)}")

    long = numba_speed[numba_speed["L"] >= 1024]
    for causal in config.causal:
        rows = long[long["causal"] == causal].set_index("L")["vs_torch"].dropna()
        kind = "causal" if causal else "non-causal"
        note = ("no torch rows (torch missing, or no L >= 1024)" if not len(rows)
                else "" if causal else floor_note("torch", rows.index))
        add(f"numba / torch, {kind}", "B=1 H=12 D=64, every L >= 1024", _fmt_ratio(rows),
            "<= 0.8", bool((rows <= 0.8).all()) if len(rows) else None, note)
    rows = numba_speed.set_index(["L", "causal"])["vs_numpy"].dropna()
    add("numba / numpy", "B=1 H=12 D=64, every L, causal and not",
        ", ".join(f"L={L}{' causal' if c else ''}: {r:.2f}" for (L, c), r in rows.items()),
        "<= 0.33", bool((rows <= 0.33).all()) if len(rows) else None,
        floor_note("numpy", numba_speed["L"]))
    peak_rows = table[table["section"].isin(["speed", "peak"]) & ok
                      & (table["impl"] == "numba") & ~table["causal"].astype(bool)
                      & (table["L"] >= config.peak_min_length)
                      & table["D"].isin(config.peak_head_sizes)]
    pct = peak_rows.set_index(["D", "L"])["pct_of_gemm_peak"]
    add("fraction of the float32 GEMM peak",
        f"non-causal, L >= {config.peak_min_length}, D in {list(config.peak_head_sizes)}",
        ", ".join(f"D={D} L={L}: {p:.0f}%" if p <= 100 else f"D={D} L={L}: fault (> 100%)"
                  for (D, L), p in pct.fillna(np.inf).items()), ">= 50%",
        bool((pct >= 50).all()) if len(pct) and pct.notna().all() else None)
    if True in config.causal and False in config.causal:
        causal_rows = table[(table["section"] == "causal") & ok]
        timed = causal_rows.pivot_table(index="L", columns="causal", values="median_ms")
        speedup = ((timed[False] / timed[True]).dropna() if True in timed and False in timed
                   else pd.Series(dtype=float))
        add("causal speed-up over non-causal", f"numba, L >= {config.peak_min_length}, "
            "timed in rounds of their own", _fmt_ratio(speedup), ">= 1.8",
            bool((speedup >= 1.8).all()) if len(speedup) else None,
            "" if len(speedup) else f"no causal rows (no L >= {config.peak_min_length})")
    memory = table[(table["section"] == "memory") & (table["impl"] == "numba") & ok]
    if len(memory):
        row = memory.iloc[0]
        add("extra memory of one call", f"B=1 H=12 D=64 L={int(row['L'])}",
            f"{row['extra_mib']:.1f} MiB (tracemalloc, output excluded); RSS rose "
            f"{row['rss_extra_mib']:.1f} MiB", "<= 64 MiB", bool(row["extra_mib"] <= 64))
    tiny = table[(table["section"] == "tiny") & (table["impl"] == "numba") & ok]
    if len(tiny):
        ratio = tiny.iloc[0]["vs_torch"]
        add("tiny-call latency, numba / torch", f"L={int(tiny.iloc[0]['L'])} H=1 D=64",
            f"{ratio:.2f} ({tiny.iloc[0]['median_ms'] * 1e3:.0f} us)", "<= 2",
            bool(ratio <= 2) if ratio == ratio else None)
    padding = table[(table["section"] == "padding") & ok].set_index("variant")["median_ms"]
    if len(padding) == 2:
        speedup = padding["no padding"] / padding["key_lengths=L/2"]
        add("key_lengths, half the keys padded", f"L={config.padding_length}",
            f"{speedup:.2f}x faster", ">= 1.7x", bool(speedup >= 1.7))
    parallel = table[(table["section"] == "parallel") & ok]
    if len(parallel) == 2:
        times = parallel.set_index("threads")["median_ms"]
        speedup = times[1] / times[times.index.max()]
        impossible = fault(speedup, times.index.max(), "speed-up over 1 thread")
        add(f"parallel efficiency, {int(times.index.max())} threads vs 1",
            f"L={config.parallel_length}", impossible or f"{speedup:.2f}x", ">= 1.8x",
            None if impossible else bool(speedup >= 1.8))
    startup = table[(table["section"] == "startup") & ok
                    & table["variant"].str.startswith("import")]
    if len(startup):
        seconds = startup.iloc[0]["median_ms"] / 1e3
        add("start-up (warm cache): import + first call", "new process",
            f"{seconds:.2f} s", "<= 1.5 s", bool(seconds <= 1.5))
    numba_rows = table[(table["impl"] == "numba") & ok & table["within_tolerance"].notna()]
    bad = numba_rows[~numba_rows["within_tolerance"].astype(bool)]
    add("numba's error within the tolerance", "every timed shape",
        f"{len(numba_rows) - len(bad)}/{len(numba_rows)} within; worst err/tol "
        f"{(numba_rows['max_abs_err'] / numba_rows['tolerance']).max():.2f}",
        "all", bool(bad.empty) if len(numba_rows) else None)
