"""``attnbench bench``'s precision section: half-precision inputs against float32 (issue 25).

The numba backend computes float16 and bfloat16 inputs in float32 from half loads widened
tile by tile (or into the micro-kernel's float32 panels as they are packed), so a half
call does the float32 call's arithmetic on half the bytes.  Each group is timed in
interleaved rounds (numba backend, B=1, H=12, D=64, the first call of each dtype
compiles its kernel: the warm-up):

- ``prefill``: float32, bfloat16 and float16 forward calls at each of
  ``config.precision_lengths``, causal and not (target: each half time <= 1.10x
  float32's), and torch's SDPA in bfloat16 beside them where torch is installed (target:
  numba bf16 / torch bf16 <= 1.0), also at ``config.precision_torch_lengths`` (numba and
  torch in bfloat16 only: the torch target's shorter lengths);
- ``backward``: the causal and non-causal backward (``out`` and ``lse`` given) in float32
  and bfloat16 at ``config.precision_backward_length`` (target <= 1.15x);
- ``decode``: one decode step (:func:`kernels.attention_with_kvcache`, B=1, H=32, Hkv=8,
  D=128, Lq=1, a cache of ``config.decode_length``) in float32 and bfloat16: bound by the
  bytes of K and V it reads, half of them in bfloat16 (target: float32 / bfloat16 >= 1.7).

Rows keep their samples (``samples_ms``): the targets are decided from the ratio's 95%
interval (:mod:`attnbench.bench.interval_targets`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np
import pandas as pd

from attnbench import kernels
from attnbench.bench.backward import _dout, numba_backward_call
from attnbench.bench.config import BenchConfig
from attnbench.bench.interval_targets import _find, _ratio_target
from attnbench.bench.sections import _inputs, _row, interval_timings
from attnbench.kernels._dtypes import as_dtype
from attnbench.measure import peers
from attnbench.measure.flops import attention_flops, backward_flops, gflops
from attnbench.measure.intervals import format_samples

#: The dtypes of the prefill group (float32 first: the denominator of every ratio).
PREFILL_DTYPES = ("float32", "bfloat16", "float16")
#: Those of the backward group.
BACKWARD_DTYPES = ("float32", "bfloat16")
#: The ``impl`` of torch's bfloat16 rows.
TORCH = "torch"


def _torch_call(q, k, v, causal: bool) -> Callable[[], object]:
    """torch's CPU SDPA on bfloat16 copies of q, k, v (the caller checks torch is there)."""
    import torch

    tensors = [torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(torch.bfloat16)
               for x in (q, k, v)]

    def call():
        with torch.no_grad():
            return torch.nn.functional.scaled_dot_product_attention(*tensors, is_causal=causal)
    return call


def _rows(config: BenchConfig, group: str, L: int, causal: bool, threads: int,
          calls: dict[tuple[str, str], tuple[Callable[[], object], int]]) -> list[dict]:
    """Time ``calls`` ((impl, dtype) -> (call, FLOPs)) interleaved; one row each."""
    timings = interval_timings({f"{impl} {dtype}": call
                                for (impl, dtype), (call, _) in calls.items()}, config)
    rows = []
    for (impl, dtype), (_, flops) in calls.items():
        timing = timings[f"{impl} {dtype}"]
        rows.append(_row("precision", impl, variant=group, B=config.batch, H=config.heads,
                         L=L, D=config.head_size, causal=causal, dtype=as_dtype(dtype),
                         threads=threads, **timing.ms_columns(),
                         samples_ms=format_samples(timing.samples),
                         gflops=gflops(flops, timing.median)))
    return rows


def precision_section(config: BenchConfig, threads: int,
                      progress: Callable[[str], None] = print) -> list[dict]:
    """The precision section's rows (see the module's docstring)."""
    B, H, D = config.batch, config.heads, config.head_size
    rows = []
    with_torch = TORCH in config.peers and peers.peer_status(TORCH)[0]
    torch_only = [L for L in config.precision_torch_lengths
                  if with_torch and L not in config.precision_lengths]
    for L in sorted(set(config.precision_lengths) | set(torch_only)):
        base = _inputs(B, H, L, D, np.float32)  # the same values in every dtype
        dtypes = ("bfloat16",) if L in torch_only else PREFILL_DTYPES
        for causal in config.causal:
            progress(f"precision prefill L={L} {'causal' if causal else 'non-causal'}: "
                     + ", ".join(dtypes) + (" (numba and torch)" if L in torch_only else ""))
            flops = attention_flops(B, H, L, L, D, causal=causal)
            calls = {}
            for name in dtypes:
                q, k, v = (x.astype(as_dtype(name)) for x in base)
                calls["numba", name] = (partial(kernels.attention, q, k, v, causal=causal,
                                                backend="numba"), flops)
            if with_torch:
                calls[TORCH, "bfloat16"] = (_torch_call(*base, causal), flops)
            rows += _rows(config, "prefill", L, causal, threads, calls)
    L = config.precision_backward_length
    base = _inputs(B, H, L, D, np.float32)
    for causal in config.causal:
        progress(f"precision backward L={L} {'causal' if causal else 'non-causal'}: "
                 "float32, bfloat16")
        calls = {}
        for name in BACKWARD_DTYPES:
            q, k, v = (x.astype(as_dtype(name)) for x in base)
            calls["numba", name] = (numba_backward_call(q, k, v, _dout(q), causal),
                                    backward_flops(B, H, L, L, D, causal=causal))
        rows += _rows(config, "backward", L, causal, threads, calls)
    return rows + _decode_rows(config, threads, progress)


#: The decode group's shape: B, H, Hkv, D (issue 23's bandwidth point).
DECODE_SHAPE = (1, 32, 8, 128)


def _decode_rows(config: BenchConfig, threads: int, progress) -> list[dict]:
    """One decode step in float32 and bfloat16 on the same values, interleaved."""
    B, H, Hkv, D = DECODE_SHAPE
    L = config.decode_length
    progress(f"precision decode B={B} H={H} Hkv={Hkv} D={D} cache {L}: float32, bfloat16")
    rng = np.random.default_rng(0)
    base = [rng.standard_normal(shape, dtype=np.float32)
            for shape in ((B, H, 1, D), (B, Hkv, L, D), (B, Hkv, L, D))]
    calls, nbytes = {}, {}
    for name in BACKWARD_DTYPES:
        q, k_cache, v_cache = (x.astype(as_dtype(name)) for x in base)
        calls[f"numba {name}"] = partial(kernels.attention_with_kvcache, q, k_cache, v_cache,
                                         cache_seqlens=np.full(B, L), backend="numba")
        calls[f"numba {name}"]()  # compiles (untimed)
        nbytes[name] = k_cache.nbytes + v_cache.nbytes
    timings = interval_timings(calls, config)
    return [_row("precision", "numba", variant="decode", B=B, H=H, L=L, D=D, causal=True,
                 dtype=as_dtype(name), threads=threads,
                 **timings[f"numba {name}"].ms_columns(),
                 samples_ms=format_samples(timings[f"numba {name}"].samples),
                 gflops=gflops(attention_flops(B, H, 1, L, D), timings[f"numba {name}"].median),
                 extra_mib=nbytes[name] / 2**20)  # bytes of K and V read per call, in MiB
            for name in BACKWARD_DTYPES]


def precision_targets(table: pd.DataFrame, causal_kinds=(False, True)) -> list[dict]:
    """The precision section's targets, each from the ratio's 95% interval."""
    rows = table[(table["section"] == "precision") & (table["status"] == "ok")]

    def pairs(group, num, den):
        found = []
        for L in sorted(int(L) for L in rows[rows["variant"] == group]["L"].unique()):
            for causal in causal_kinds:
                a = _find(rows, variant=group, L=L, causal=causal, impl=num[0], dtype=num[1])
                b = _find(rows, variant=group, L=L, causal=causal, impl=den[0], dtype=den[1])
                if a is not None and b is not None:
                    found.append((f"L={L}{' causal' if causal else ''}", a, b))
        return found

    shape = "numba, B=1 H=12 D=64, causal and not"
    return [
        _ratio_target("bfloat16 prefill / float32", shape,
                      pairs("prefill", ("numba", "bfloat16"), ("numba", "float32")), 1.10,
                      at_most=True),
        _ratio_target("float16 prefill / float32", shape,
                      pairs("prefill", ("numba", "float16"), ("numba", "float32")), 1.10,
                      at_most=True),
        _ratio_target("bfloat16 backward / float32", shape,
                      pairs("backward", ("numba", "bfloat16"), ("numba", "float32")), 1.15,
                      at_most=True),
        _ratio_target("float32 decode / bfloat16 decode", "numba, B=1 H=32 Hkv=8 D=128 Lq=1",
                      pairs("decode", ("numba", "float32"), ("numba", "bfloat16")), 1.7,
                      at_most=False),
        _ratio_target("numba / torch SDPA, bfloat16", shape,
                      pairs("prefill", ("numba", "bfloat16"), (TORCH, "bfloat16")), 1.0,
                      at_most=True, note="" if peers.peer_status(TORCH)[0]
                      else "torch is not installed"),
    ]
