"""The GPU check: CUDA tests on the device and a short sweep against PyTorch's SDPA.

``scripts/gpu-check.sh`` installs attnbench with its CUDA extra and runs
``python -m attnbench.gpu_check --mode device`` (``NUMBA_ENABLE_CUDASIM=0``) on a machine
with an NVIDIA GPU, or ``--mode simulator`` (``NUMBA_ENABLE_CUDASIM=1``) anywhere.  It:

1. says where the CUDA code runs, and refuses a mode that does not match: ``device``
   needs numba.cuda to see a real GPU, ``simulator`` needs the simulator;
2. on a device, records the card (:func:`attnbench.measure.gpu_device.device_record`) and its
   peaks: the theoretical fp32 peak from the attributes, and the FMA kernel's measured
   fp32 and fp64 throughput beside it (a cross-check of both);
3. runs the CUDA tests in a pytest subprocess: on a device ``tests/test_cuda.py`` and
   ``tests/test_gpu_timing.py`` whole (the same differential tests as in the simulator,
   plus the device-only ones); in the simulator, a quick subset (the suite runs the rest);
4. sweeps the cuda backend, and PyTorch's SDPA on the GPU (``torch-cuda``) when torch
   with CUDA is importable, over L, no mask and causal (tiny sizes in the simulator),
   with the same runner as ``attnbench sweep``: device-resident inputs, CUDA events,
   copies timed apart, every output checked against the float64 oracle;
5. writes OUT/sweep.csv, sweep.parquet, sweep.json, sweep.jsonl and scaling.csv (as
   ``attnbench sweep`` does: ``attnbench report OUT`` renders them), OUT/report.html,
   OUT/pytest.log and OUT/gpu-check.json (all of the above, machine-readable), and
   ends with one line saying whether it ran on the device or only in the simulator.

Everything stops at the time budget (``--budget``, seconds for this part): points not
reached are recorded as skipped with that reason.  Exit status: 0 if the tests passed
and every point of the cuda backend ran within the tolerance (torch-cuda's rows are
reported, not judged); 1 otherwise; 2 if the mode does not match the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["main", "plan", "sweep_points"]

#: Where the repository's tests are (the script runs from the repository root).
REPO = Path(__file__).resolve().parents[1]
#: pytest arguments per mode.
TESTS = {
    "device": ["tests/test_cuda.py", "tests/test_gpu_timing.py"],
    "simulator": ["tests/test_gpu_timing.py", "-k",
                  "fma_kernel_computes or prepare_launch or theoretical"],
}
#: The sweep per mode: (L values, d_k, heads, masks, dtypes).
SWEEPS = {
    "device": dict(L=(256, 512, 1024, 2048, 4096), d_k=(64,), heads=(4,),
                   mask=("none", "causal"), dtype=("float32",)),
    "simulator": dict(L=(8, 16), d_k=(4,), heads=(1,), mask=("none", "causal"),
                      dtype=("float32",)),
}
#: Oracle limit of the device sweep: L = 4096 with 4 heads (67 M scores, ~2.7 GB).
ORACLE_LIMIT = 2**26


def sweep_points(mode: str, *, torch_cuda: bool):
    """The points of the check's sweep."""
    from attnbench.sweep.grid import Grid, expand

    backends = ("cuda", "torch-cuda") if torch_cuda else ("cuda",)
    return expand([Grid(backend=backends, **SWEEPS[mode])])


def plan(mode: str, out: Path) -> list[str]:
    """What a run does, in words (``--dry-run`` prints it)."""
    sweep = SWEEPS[mode]
    return [
        f"mode: {mode} (NUMBA_ENABLE_CUDASIM={'1' if mode == 'simulator' else '0'})",
        "tests: python -m pytest -q " + shlex.join(TESTS[mode]),
        f"sweep: backends cuda (+ torch-cuda if torch sees a GPU), L {sweep['L']}, "
        f"d_k {sweep['d_k'][0]}, heads {sweep['heads'][0]}, masks {', '.join(sweep['mask'])}, "
        f"{', '.join(sweep['dtype'])}",
        f"results: {out}/sweep.csv, sweep.parquet, sweep.json, sweep.jsonl, scaling.csv, "
        f"report.html, pytest.log, gpu-check.json",
    ]


def _where(mode: str) -> tuple[bool, str]:
    """``(matches, description)`` of where numba.cuda runs, against ``mode``."""
    from attnbench.kernels import cuda_simulator_enabled, cuda_status

    usable, why = cuda_status()
    simulated = cuda_simulator_enabled()
    if mode == "simulator":
        if not simulated:
            return False, "the simulator was asked for but NUMBA_ENABLE_CUDASIM is not set"
        return usable, f"SIMULATOR: {why}"
    if simulated:
        return False, "a device was asked for but NUMBA_ENABLE_CUDASIM is set: unset it"
    if not usable:
        return False, f"a device was asked for but numba.cuda cannot use one: {why}"
    return True, f"DEVICE: {why}"


def _peaks() -> dict:
    """The card's theoretical fp32 peak and the FMA kernel's measurements, GFLOP/s."""
    import numpy as np

    from attnbench.measure import gpu_device

    record = gpu_device.device_record()
    result = {"fp32_theoretical": record.get("fp32_peak_theoretical_gflops")}
    for name, dtype in (("fp32_fma_measured", np.float32), ("fp64_fma_measured", np.float64)):
        try:
            result[name] = gpu_device.fma_peak_gflops(dtype)
        except Exception as exc:  # reported, not fatal: the tests say more
            result[name] = f"failed: {type(exc).__name__}: {exc}"
    return result


def _run_tests(mode: str, out: Path, timeout: float) -> dict:
    """The CUDA tests in a subprocess; their summary line and log."""
    args = TESTS[mode]
    if not (REPO / args[0]).exists():
        return {"status": "not run", "reason": f"no {args[0]} here (run from a clone)"}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *args]
    started = time.perf_counter()
    try:
        proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                              timeout=max(timeout, 1), env=os.environ.copy())
        output, returncode = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        output = (exc.stdout or b"").decode(errors="replace") if isinstance(
            exc.stdout, bytes) else (exc.stdout or "")
        output += f"\n(timed out after {timeout:.0f} s)"
        returncode = 124
    (out / "pytest.log").write_text(output)
    summary = ""
    for line in reversed(output.splitlines()):
        if re.search(r"\d+ (passed|failed|error)", line):
            summary = line.strip("= ").strip()
            break
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?)",
                                                     summary)}
    return {"status": "passed" if returncode == 0 else "failed", "returncode": returncode,
            "summary": summary or (output.strip().splitlines() or [""])[-1],
            "counts": counts,
            "command": " ".join(command), "seconds": time.perf_counter() - started}


def _until(deadline: float):
    """An executor that stops running points at ``deadline`` (monotonic seconds)."""
    def executor(points, run_point):
        for point in points:
            if time.monotonic() > deadline:
                yield {**point.as_dict(), "status": "skipped",
                       "reason": "skipped: the gpu-check time budget was spent"}
            else:
                yield run_point(point)
    return executor


def _run_sweep(mode: str, out: Path, deadline: float) -> tuple[dict, object]:
    from attnbench.measure import gpu_device
    from attnbench.report import build as report
    from attnbench.report.hosts import host_peaks, scaling_by_group
    from attnbench.studies.scaling import scaling_table
    from attnbench.sweep.files import save_results
    from attnbench.sweep.journal import JOURNAL_NAME, Journal, journaled, load_journal
    from attnbench.sweep.run import run_sweep
    from attnbench.sweep.runner import PointRunner

    torch_usable, torch_why = gpu_device.backend_status("torch-cuda")
    points = sweep_points(mode, torch_cuda=torch_usable)
    runner = PointRunner(max_time=0.2 if mode == "device" else 0.01, gemm_peaks={},
                         oracle_limit=ORACLE_LIMIT, allow_simulator=mode == "simulator")
    with Journal(out / JOURNAL_NAME, settings={"gpu_check": mode}) as journal:
        result = run_sweep(points, runner=runner, gemm_peaks={}, progress=False,
                           check_threads=False,
                           executor=journaled(_until(deadline), journal))
    table = result.table
    by_group = host_peaks(table)
    save_results(result, out, extra_meta={"gpu_check": mode, "gemm_peak_gflops_by_host":
                                          by_group, "journal": JOURNAL_NAME,
                                          "machines": load_journal(out / JOURNAL_NAME).machines})
    scaling_by_group(table, scaling_table).to_csv(out / "scaling.csv", index=False)
    html = report.build_report(out)
    counts = table["status"].value_counts().to_dict() if not table.empty else {}
    # attnbench's own backend decides the exit status; the peer's rows are reported.
    ours = table[table["backend"] == "cuda"] if not table.empty else table
    outside = 0
    if "within_tolerance" in ours:
        outside = int(ours["within_tolerance"].astype("boolean").eq(False).fillna(False).sum())
    failed = int((ours["status"] == "failed").sum()) if not ours.empty else 0
    summary = {"points": len(points), "statuses": counts, "cuda_failed": failed,
               "outside_tolerance": outside,
               "torch_cuda": torch_why, "seconds": result.seconds, "report": str(html)}
    return summary, table


def _comparison(table) -> str:
    """cuda against torch-cuda per point, as text."""
    import pandas as pd

    from attnbench.report.hosts import ratio_table

    ok = table[table["status"] == "ok"]
    if ok.empty:
        return "(no point ran)"
    wide = ratio_table(ok, ["L", "mask", "dtype"], "backend", order=["torch-cuda", "cuda"])
    extra = ok.groupby(["L", "mask", "dtype"])[["h2d_ms", "d2h_ms"]].median()
    shown = pd.concat([wide, extra], axis=1).reset_index()
    return shown.to_string(index=False, float_format=lambda x: f"{x:.4g}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attnbench.gpu_check",
        description="CUDA tests on the device and a short sweep against PyTorch's SDPA "
                    "(see scripts/gpu-check.sh).")
    parser.add_argument("--mode", choices=("device", "simulator"), required=True)
    parser.add_argument("--out", type=Path, default=Path("reports/gpu-check"))
    parser.add_argument("--budget", type=float, default=240.0,
                        help="seconds for the tests and the sweep together (default 240)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and stop")
    args = parser.parse_args(argv)
    if args.dry_run:
        print("\n".join(plan(args.mode, args.out)))
        return 0
    started = time.monotonic()
    deadline = started + args.budget
    matches, where = _where(args.mode)
    print(f"CUDA runs in: {where}", flush=True)
    if not matches:
        print(f"gpu-check: error: {where}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    from attnbench.measure import gpu_device

    summary = {"mode": args.mode, "ran_on": "device" if args.mode == "device" else "simulator",
               "where": where, "device": gpu_device.device_record()}
    if args.mode == "device":
        summary["peaks_gflops"] = _peaks()
        print("Peaks (GFLOP/s): " + ", ".join(
            f"{k} {v:.0f}" if isinstance(v, float) else f"{k} {v}"
            for k, v in summary["peaks_gflops"].items()), flush=True)
    # The tests get 60% of the budget; the sweep what is left.
    tests = _run_tests(args.mode, args.out, timeout=0.6 * (deadline - time.monotonic()))
    summary["tests"] = tests
    print(f"Tests ({tests.get('command', '')}): {tests['status']}: "
          f"{tests.get('summary') or tests.get('reason')}", flush=True)
    sweep, table = _run_sweep(args.mode, args.out, deadline)
    summary["sweep"] = sweep
    print(_comparison(table))
    summary["seconds"] = time.monotonic() - started
    failed_points = sweep["cuda_failed"] + sweep["outside_tolerance"]
    status = int(tests["status"] != "passed" or failed_points > 0)
    summary["exit_status"] = status
    (args.out / "gpu-check.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    statuses = ", ".join(f"{n} {s}" for s, n in sweep["statuses"].items())
    verdict = (f"ran on the DEVICE ({summary['device'].get('name')})" if args.mode == "device"
               else "ran ONLY IN THE SIMULATOR (no GPU used: times are not GPU times)")
    if sweep["outside_tolerance"]:
        statuses += f", {sweep['outside_tolerance']} cuda point(s) outside the tolerance"
    print(f"\nRESULT: {verdict}; tests {tests['status']}; sweep: {statuses}; results in "
          f"{args.out} ({summary['seconds']:.0f} s); exit status {status}")
    return status


if __name__ == "__main__":
    sys.exit(main())
