"""Vector width of the numba kernel's compiled loops, per target CPU: a static check.

The question: does LLVM's tuning for Intel's AVX-512 server cores (``prefer-256-bit``)
make Numba compile the kernel's loops (the polynomial exp, the row max, the rescaling)
to 256-bit ymm vectors where the BLAS runs 512-bit zmm, while AMD's Zen 4 gets zmm.
This script answers it from the assembly, without timing anything.

For each target it starts a fresh Python with ``NUMBA_CPU_NAME`` / ``NUMBA_CPU_FEATURES``
set (Numba reads them once, at import) and ``NUMBA_CACHE_DIR`` in a new temporary
folder (the kernel is ``cache=True``: the code read must be compiled in that process, for
that CPU, not loaded from a cache).  The child builds the arguments of a small problem
exactly as ``kernels.numba_cpu.run`` does, compiles ``_attention_serial`` for them
(float32 and float64, BLAS and loops-only variants) *without running it* (code tuned to
another CPU may hold instructions this one lacks), and counts, in each hot function's own
assembly (``dispatcher.inspect_asm``), the instructions whose widest register is zmm,
ymm or xmm (xmm split into scalar ``ss``/``sd`` and the rest), plus three markers:

- ``fma``: vfmadd/vfmsub/vfnmadd/vfnmsub (the exp polynomial, the rescaling);
- ``max``: vpmaxsd/vpmaxsq (the row maximum, taken on integer keys);
- ``exp``: vpslld $23 / vpsllq $52 (the exp's 2**n, inlined from ``exp32``/``exp64``),

each as ``zmm/ymm/xmm`` counts (their xmm includes scalar ``ss``/``sd`` forms).  In
float32 under ``prefer-256-bit`` a few zmm remain: 8 x int64 index vectors of
``vscatterqps`` and their address arithmetic, not float lanes.

Feature strings: ``host`` uses Numba's default (the host's ISA features); a named CPU
uses ``""``, i.e. LLVM's own ISA and tuning defaults for that CPU, as on such a machine;
each is then also compiled with the ``prefer-256-bit`` tuning flag flipped
(``-prefer-256-bit`` for Intel, ``+prefer-256-bit`` for the host and Zen 4, as a
control).  LLVM has no ``prefer-512-bit`` feature: without ``prefer-256-bit`` (or
``prefer-128-bit``) the preferred width is the widest register.  A CPU this LLVM does
not know is reported as such (LLVM would silently fall back to a generic CPU).

Usage::

    .venv/bin/python scripts/vector_width.py              # all targets, table to stdout
    .venv/bin/python scripts/vector_width.py --cpus host sapphirerapids --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

#: Target CPUs: this machine and LLVM's names for AMD and Intel AVX-512 server cores.
CPUS = ["host", "znver4", "skylake-avx512", "icelake-server", "sapphirerapids",
        "emeraldrapids", "graniterapids"]
#: Hot functions of kernels/numba_cpu.py, as (report name, dispatcher, BLAS variant).
FUNCTIONS = [
    ("_attend_block[blas]", "_attend_block", True),
    ("_attend_block[loops]", "_attend_block", False),
    ("_scores_by_loops", "_scores_by_loops", False),
    ("_values_by_loops", "_values_by_loops", False),
    ("_all_finite", "_all_finite", True),
    ("_mask_tile_count", "_mask_tile_count", True),
]
_FMA = re.compile(r"^vf(n?)m(add|sub)")
_MAX = re.compile(r"^vpmaxs[dq]$")
_EXP_SHIFT = re.compile(r"^vpsll([dq])$")


def _width(line: str) -> str | None:
    for reg in ("zmm", "ymm", "xmm"):
        if "%" + reg in line:
            return reg
    return None


def count(asm: str, symbol: str) -> dict:
    """Vector instruction counts of the function ``symbol`` in an AT&T assembly listing."""
    start = asm.index(symbol + ":\n")
    end = asm.index(".Lfunc_end", start)
    counts = {"zmm": 0, "ymm": 0, "xmm": 0, "scalar": 0}
    markers = {m: {"zmm": 0, "ymm": 0, "xmm": 0} for m in ("fma", "max", "exp")}
    for line in asm[start:end].splitlines()[1:]:
        text = line.split("#")[0].strip()
        if not text or text.startswith(".") or text.endswith(":"):
            continue
        op = text.split()[0]
        width = _width(text)
        if width is None:
            continue
        if width == "xmm" and op.endswith(("ss", "sd")):
            counts["scalar"] += 1
        else:
            counts[width] += 1
        shift = _EXP_SHIFT.match(op)
        if _FMA.match(op):
            markers["fma"][width] += 1
        elif _MAX.match(op):
            markers["max"][width] += 1
        elif shift and ("$23," if shift.group(1) == "d" else "$52,") in text:
            markers["exp"][width] += 1
    return {**counts, **markers}


def child() -> dict:
    """Compile the kernel in this process (CPU from the environment) and count its asm."""
    import numpy as np
    from numba import typeof

    from attnbench import kernels
    from attnbench.kernels.numba_cpu import choose, forward

    compiled = {}
    for dtype in (np.float32, np.float64):
        q = np.zeros((1, 1, 64, 64), dtype)
        problem = kernels.prepare(q, q, q)
        for blas in (True, False):
            captured = []
            real = forward._attention_serial
            forward._attention_serial = lambda *args: captured.append(args)  # noqa: B023
            try:
                choose.run(problem, parallel=False, use_blas=blas)
            finally:
                forward._attention_serial = real
            real.compile(tuple(typeof(a) for a in captured[0]))  # compiled, never run
    for name, attr, blas in FUNCTIONS:
        dispatcher = getattr(forward, attr)
        for sig, asm in dispatcher.inspect_asm().items():
            if attr == "_attend_block" and (str(sig[-1]) == "none") == blas:
                continue
            prefix = f"_ZN7kernels9numba_cpu7forward{len(attr)}{attr}B"
            symbol = re.search(r"^(" + re.escape(prefix) + r"\S*):$", asm, re.M).group(1)
            compiled[f"{name}|{sig[0].dtype}"] = count(asm, symbol)
    return compiled


def run_target(cpu: str, features: str | None) -> dict:
    """Run :func:`child` in a fresh interpreter for one CPU name and feature string."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CPU_")}
    if cpu != "host":
        env["NUMBA_CPU_NAME"] = cpu
    if features is not None:
        env["NUMBA_CPU_FEATURES"] = features
    with tempfile.TemporaryDirectory() as cache:
        env["NUMBA_CACHE_DIR"] = cache
        proc = subprocess.run([sys.executable, __file__, "--child"], env=env,
                              capture_output=True, text=True)
    if "not a recognized processor" in proc.stderr:
        return {"error": f"LLVM does not know {cpu!r}"}
    if proc.returncode:
        return {"error": proc.stderr.strip().splitlines()[-1:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def variants(cpu: str) -> list[tuple[str, str | None]]:
    """(label, NUMBA_CPU_FEATURES) pairs: the CPU's defaults, then prefer-256-bit flipped."""
    if cpu == "host":
        from llvmlite import binding as llvm

        host = llvm.get_host_cpu_features().flatten()
        return [("default", None), ("+prefer-256-bit", host + ",+prefer-256-bit")]
    flip = "+prefer-256-bit" if cpu.startswith("znver") else "-prefer-256-bit"
    return [("default", ""), (flip, flip)]


def _fmt(m: dict) -> str:
    return "/".join(str(m[w]) for w in ("zmm", "ymm", "xmm"))


def main() -> None:
    """Print the table for ``--cpus`` (and write it to ``--json``); ``--child`` compiles."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpus", nargs="+", default=CPUS, help="LLVM CPU names, or host")
    parser.add_argument("--json", help="also write the counts to this file")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child()))
        return
    import llvmlite
    import numba
    from llvmlite import binding as llvm

    print(f"numba {numba.__version__}, llvmlite {llvmlite.__version__}, LLVM "
          f"{'.'.join(map(str, llvm.llvm_version_info))}, host CPU {llvm.get_host_cpu_name()}")
    print("\ncounts: zmm ymm xmm scalar instructions; markers as zmm/ymm/xmm\n")
    print("| cpu | features | function | dtype | zmm | ymm | xmm | scalar | fma | max | exp |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    results = {}
    for cpu in args.cpus:
        for label, features in variants(cpu):
            res = run_target(cpu, features)
            results[f"{cpu}|{label}"] = res
            if "error" in res:
                print(f"| {cpu} | {label} | {res['error']} |||||||||", flush=True)
                continue
            for key, c in res.items():
                fn, dtype = key.split("|")
                print(f"| {cpu} | {label} | {fn} | {dtype} | {c['zmm']} | {c['ymm']} | "
                      f"{c['xmm']} | {c['scalar']} | {_fmt(c['fma'])} | {_fmt(c['max'])} | "
                      f"{_fmt(c['exp'])} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
