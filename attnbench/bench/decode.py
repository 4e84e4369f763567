"""``attnbench bench``'s decode section: :func:`kernels.attention_with_kvcache` (numba,
float32, Lq = 1, D = 128) against the machine's read bandwidth and against itself.

Each group is timed in interleaved rounds (:func:`attnbench.bench.sections.interval_timings`):

- ``bandwidth``: B=1 (cache ``decode_length``) and B=8 (caches of ``decode_batch_length``),
  H=32, Hkv=8, beside the read-bandwidth probe (:mod:`attnbench.measure.bandwidth`: a
  streaming read of 256 MiB on the same threads) in the same rounds: bytes of K and V read
  ÷ time, against the probe's bytes ÷ time;
- ``splits``: B=1, H=8, Hkv=1 (MQA), cache ``decode_mqa_length``, ``num_splits=0`` against 1
  (which runs on one thread), beside the probe on one thread and on the run's threads: a
  step bound by memory gains from the threads at most what the probe gains (on two cores
  that can be little more than 1x), so the target's 1.7x measures how well
  the threads share the arithmetic and hide the reads, not bandwidth;
- ``gqa``: H=32/Hkv=8 against H=8/Hkv=8 on the same cache (the same bytes read);
- ``paged``: page sizes 16 and 256, pages in shuffled order, against the contiguous cache;
- ``torch``: PyTorch's SDPA on the same step (``enable_gqa=True``, same threads) where
  torch is installed (a ``missing`` row otherwise).

No cache is appended to (``k=v=None``): every call reads the same keys.  Rows keep their
samples (``samples_ms``); :func:`decode_targets` decides each target from the 95%
interval of a ratio of medians (:func:`attnbench.bench.interval_targets.interval_verdict`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np

from attnbench import kernels
from attnbench.bench.interval_targets import INCONCLUSIVE, _find, combine, interval_verdict
from attnbench.bench.sections import _row, interval_timings
from attnbench.measure import peers
from attnbench.measure.bandwidth import stream_readers
from attnbench.measure.intervals import format_samples, parse_samples, ratio_interval

D = 128
PROBE = "read-bandwidth probe"
#: The probe beside the split target, on one thread and on the run's threads.
PROBE_ONE, PROBE_ALL = f"{PROBE}, 1 thread", f"{PROBE}, all threads"


def random_cache(rng, B, Hkv, L, page_size=None):
    """``(k_cache, v_cache, block_table)`` of float32 normal draws, D = 128: contiguous
    (B, Hkv, L, D), or paged (B·pages, Hkv, page_size, D) with the pages shuffled."""
    if page_size is None:
        shape, table = (B, Hkv, L, D), None
    else:
        per_seq = -(-L // page_size)
        shape = (B * per_seq, Hkv, page_size, D)
        table = rng.permutation(B * per_seq).reshape(B, per_seq)
    return (rng.standard_normal(shape, dtype=np.float32),
            rng.standard_normal(shape, dtype=np.float32), table)


def _decode_call(rng, B, H, Hkv, L, page_size=None, num_splits=0, cache=None):
    if cache is None:
        cache = random_cache(rng, B, Hkv, L, page_size)
    k_cache, v_cache, table = cache
    q = rng.standard_normal((B, H, 1, D), dtype=np.float32)
    call = partial(kernels.attention_with_kvcache, q, k_cache, v_cache,
                   cache_seqlens=np.full(B, L), block_table=table, num_splits=num_splits,
                   backend="numba")
    call()  # compiles (untimed)
    return call, (k_cache, v_cache, table)


def _label(B, H, Hkv, L, extra=""):
    return f"B={B} H={H} Hkv={Hkv} L={L}" + (f" {extra}" if extra else "")


def _group(group: str, calls: dict, shapes: dict, config, threads) -> list[dict]:
    timings = interval_timings(calls, config)
    rows = []
    for name, timing in timings.items():
        B, H, L, nbytes = shapes[name]
        rows.append(_row("decode", PROBE if name.startswith(PROBE) else "numba",
                         variant=f"{group}: {name}", B=B, H=H, L=L, D=D, causal=True,
                         dtype=np.float32, threads=threads, **timing.ms_columns(),
                         samples_ms=format_samples(timing.samples),
                         extra_mib=nbytes / 2**20))  # bytes read per call, in MiB
    return rows


def decode_section(config, threads: int, progress: Callable[[str], None] = print) -> list[dict]:
    """The decode section's rows (see the module's docstring)."""
    rng = np.random.default_rng(0)
    # the probe on the run's threads, and on one beside the split target: the same array
    (read, read_one), probe_bytes = stream_readers((threads, 1))
    rows = []
    kv_bytes = lambda B, Hkv, L: B * Hkv * L * 2 * D * 4  # noqa: E731  (K and V, float32)

    L1, LB = config.decode_length, config.decode_batch_length
    progress(f"decode  bandwidth: B=1 L={L1} and B=8 L={LB}, H=32 Hkv=8, beside the probe")
    calls, shapes = {PROBE: read}, {PROBE: (0, 0, 0, probe_bytes)}
    for B, L in ((1, L1), (8, LB)):
        name = _label(B, 32, 8, L)
        calls[name], cache = _decode_call(rng, B, 32, 8, L)
        shapes[name] = (B, 32, L, kv_bytes(B, 8, L))
    rows += _group("bandwidth", calls, shapes, config, threads)

    LM = config.decode_mqa_length
    progress(f"decode  num_splits=0 vs 1: B=1 H=8 Hkv=1 L={LM}")
    split0, mqa = _decode_call(rng, 1, 8, 1, LM, num_splits=0)
    split1, _ = _decode_call(rng, 1, 8, 1, LM, num_splits=1, cache=mqa)
    split_calls = {"num_splits=0": split0, "num_splits=1": split1, PROBE_ONE: read_one,
                   PROBE_ALL: read}
    split_shapes = dict.fromkeys(("num_splits=0", "num_splits=1"), (1, 8, LM, kv_bytes(1, 1, LM)))
    split_shapes.update(dict.fromkeys((PROBE_ONE, PROBE_ALL), (0, 0, 0, probe_bytes)))
    rows += _group("splits", split_calls, split_shapes, config, threads)

    progress(f"decode  GQA H=32/Hkv=8 vs H=8/Hkv=8, and paged (16, 256) vs contiguous, L={L1}")
    gqa, contiguous = _decode_call(rng, 1, 32, 8, L1)
    mha, _ = _decode_call(rng, 1, 8, 8, L1, cache=contiguous)
    same = (1, 32, L1, kv_bytes(1, 8, L1))
    rows += _group("gqa", {"H=32 Hkv=8": gqa, "H=8 Hkv=8": mha},
                   {"H=32 Hkv=8": same, "H=8 Hkv=8": (1, 8, L1, same[3])}, config, threads)
    paged = {"contiguous": gqa}
    for page_size in (16, 256):
        paged[f"page {page_size}"], _ = _decode_call(rng, 1, 32, 8, L1, page_size=page_size)
    del contiguous, mqa
    rows += _group("paged", paged, dict.fromkeys(paged, same), config, threads)
    rows += _torch_rows(rng, config, threads, L1)
    return rows


def _torch_rows(rng, config, threads, L) -> list[dict]:
    """numba against torch's SDPA on one decode step, or a ``missing`` row."""
    usable, why = peers.peer_status("torch")
    shape = dict(B=1, H=32, L=L, D=D, causal=True, dtype=np.float32, threads=threads)
    if not usable:
        return [_row("decode", "torch", variant="torch: sdpa", status=f"missing: {why}",
                     **shape)]
    import torch

    numba_call, (k_cache, v_cache, _) = _decode_call(rng, 1, 32, 8, L)
    q = torch.from_numpy(rng.standard_normal((1, 32, 1, D), dtype=np.float32))
    k, v = torch.from_numpy(k_cache), torch.from_numpy(v_cache)

    def sdpa():
        with torch.no_grad():
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    sdpa()
    return _group("torch", {"numba": numba_call, "sdpa": sdpa},
                  dict.fromkeys(("numba", "sdpa"), (1, 32, L, 2 * k_cache.nbytes)), config,
                  threads)


def _ratio(num, den, scale=1.0):
    ratio, low, high = ratio_interval(parse_samples(num["samples_ms"]),
                                      parse_samples(den["samples_ms"]))
    return ratio * scale, low * scale, high * scale


def decode_targets(table) -> list[dict]:
    """The issue's decode targets, each from the 95% interval of a ratio of medians."""
    rows = table[(table["section"] == "decode") & (table["status"] == "ok")]
    targets = []

    def target(name, shape, pairs, goal, at_most, note=""):
        measured, verdicts = [], []
        for label, ratio, low, high in pairs:
            measured.append(f"{label}{': ' if label else ''}{ratio:.2f} [{low:.2f}, {high:.2f}]")
            verdicts.append(interval_verdict(low, high, goal, at_most=at_most))
        met = combine(verdicts)
        targets.append({"target": name, "shape": shape, "measured": ", ".join(measured),
                        "goal": f"{'<=' if at_most else '>='} {goal:g}", "met": met,
                        "note": note if pairs else "; ".join(filter(None, (
                            note, "no rows (section not run, or a peer missing)")))})

    probe = _find(rows, variant=f"bandwidth: {PROBE}")
    for B, label in ((1, "B=1"), (8, "B=8")):
        run = rows[(rows["variant"].str.startswith("bandwidth: B=")) & (rows["B"] == B)]
        pairs = []
        if probe is not None and len(run):
            row = run.iloc[0]
            # (bytes / t) / (probe bytes / t_probe) = bytes / probe bytes · t_probe / t
            pairs.append(("", *_ratio(probe, row, row["extra_mib"] / probe["extra_mib"])))
        target(f"decode read bandwidth / probe, {label}", "H=32 Hkv=8 D=128 Lq=1 fp32",
               pairs, 0.70, at_most=False, note="bytes of K and V read / time")
    one, every = (_find(rows, variant=f"splits: {name}") for name in (PROBE_ONE, PROBE_ALL))
    scaling = "" if one is None or every is None else (
        "the probe on the run's threads over one thread: {:.2f} [{:.2f}, {:.2f}] (the most "
        "a step bound by memory gains)".format(*_ratio(one, every)))
    for name, shape, group, num, den, goal, at_most in (
            ("num_splits=0 speed-up over 1", "B=1 H=8 Hkv=1 (MQA)", "splits", "num_splits=1",
             "num_splits=0", 1.7, False),
            ("GQA H=32/Hkv=8 / H=8/Hkv=8 time", "B=1, same cache", "gqa", "H=32 Hkv=8",
             "H=8 Hkv=8", 1.25, True),
            ("paged (16) / contiguous time", "B=1 H=32 Hkv=8, shuffled pages", "paged",
             "page 16", "contiguous", 1.15, True),
            ("paged (256) / contiguous time", "B=1 H=32 Hkv=8, shuffled pages", "paged",
             "page 256", "contiguous", 1.15, True),
            ("decode numba / torch SDPA", "B=1 H=32 Hkv=8, enable_gqa", "torch", "numba",
             "sdpa", 1.0, True)):
        a, b = _find(rows, variant=f"{group}: {num}"), _find(rows, variant=f"{group}: {den}")
        pairs = [] if a is None or b is None else [("", *_ratio(a, b))]
        target(name, shape, pairs, goal, at_most, note=scaling if group == "splits" else "")
    return targets


__all__ = ["INCONCLUSIVE", "decode_section", "decode_targets", "random_cache"]
