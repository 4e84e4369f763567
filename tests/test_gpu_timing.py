"""GPU timing (attnbench.measure.gpu_timing): in Numba's CUDA simulator here, on the device where
there is one.

Without a GPU these tests check what can be checked: the peak arithmetic, that the FMA
kernel computes what it should (simulator), that the float32 FMA kernel and the blocker
compile to PTX without float64 instructions (real compiler, no GPU), that a cuda sweep
point runs through device arrays and is checked against the oracle (simulator), and that
the rows say the times are not GPU times.  The tests marked ``gpu`` need a real device
(they run in ``scripts/gpu-check.sh``): the FMA peak against the theoretical one, and
event timings of a real point.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("numba.cuda", reason="numba-cuda is missing: pip install attnbench[cuda]")

from attnbench.kernels._api import dispatch as _backends  # noqa: E402
from attnbench.measure import gpu_device, gpu_timing  # noqa: E402
from attnbench.sweep.grid import Point  # noqa: E402
from attnbench.sweep.runner import PointRunner, make_inputs  # noqa: E402

from .support import REPO, run_ptx_script  # noqa: E402

pytestmark = pytest.mark.cuda
SIMULATOR = _backends.cuda_simulator_enabled()
needs_cuda = pytest.mark.skipif(not _backends.cuda_status()[0], reason=_backends.cuda_status()[1])
gpu_only = pytest.mark.skipif(not _backends.has_real_gpu(), reason="needs a real CUDA GPU")


# --- the peak ---------------------------------------------------------------------------------

# (SMs, compute capability, boost clock kHz, expected GFLOP/s): an H100/H200 SXM, an A100,
# an RTX 4090 (Ada, 128 lanes per SM), an unknown architecture.
PEAKS = [
    (132, (9, 0), 1_980_000, 132 * 128 * 1.98 * 2),
    (108, (8, 0), 1_410_000, 108 * 64 * 1.41 * 2),
    (128, (8, 9), 2_520_000, 128 * 128 * 2.52 * 2),
]


@pytest.mark.parametrize("sms, cc, clock_khz, expected", PEAKS)
def test_theoretical_fp32_peak_from_device_attributes(sms, cc, clock_khz, expected):
    assert gpu_device.theoretical_fp32_gflops(sms, cc, clock_khz) == pytest.approx(expected)


def test_unknown_architecture_or_missing_clock_has_no_theoretical_peak():
    assert np.isnan(gpu_device.theoretical_fp32_gflops(10, (4, 0), 1e6))
    assert np.isnan(gpu_device.theoretical_fp32_gflops(10, (9, 0), 0))



# --- the FMA kernel, run once and computed with NumPy (test helpers) --------------------------

def fma_reference(n_threads: int, iterations: int, a: float, b: float, dtype) -> np.ndarray:
    """What the FMA kernel writes, computed with NumPy (rounding aside)."""
    dtype = np.dtype(dtype)
    step = dtype.type(1.0 / 1024)
    x0 = (np.arange(n_threads) % 64).astype(dtype) * step
    chains = [x0 + c * step for c in range(gpu_device.FMA_CHAINS)]
    for _ in range(iterations):
        chains = [x * dtype.type(a) + dtype.type(b) for x in chains]
    return ((chains[0] + chains[1]) + (chains[2] + chains[3])) + (
        (chains[4] + chains[5]) + (chains[6] + chains[7]))


def run_fma_kernel(dtype, *, blocks: int, threads: int, iterations: int,
                   a: float = 0.999, b: float = 0.001) -> np.ndarray:
    """Run the FMA kernel once and return its output (one value per thread)."""
    from numba import cuda

    from attnbench.measure._cuda_kernels import fma_kernel

    dtype = np.dtype(dtype)
    out = cuda.device_array(blocks * threads, dtype=dtype)
    fma_kernel(dtype)[blocks, threads](out, np.int64(iterations), dtype.type(a), dtype.type(b))
    return out.copy_to_host()


@needs_cuda
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_fma_kernel_computes_its_chains(dtype):
    out = run_fma_kernel(dtype, blocks=2, threads=5, iterations=7)
    expected = fma_reference(10, 7, 0.999, 0.001, dtype)
    assert out.dtype == dtype and out.shape == (10,)
    np.testing.assert_allclose(out, expected, rtol=1e-6 if dtype == np.float32 else 1e-14)
    assert len(set(out.tolist())) == 10  # every thread wrote its own value


_PTX_SCRIPT = """
import numpy as np
from numba import cuda
from attnbench.measure import _cuda_kernels as k
result = {}
for dtype in ("float32", "float64"):
    ptx, _ = cuda.compile_ptx(k.fma_source(np.dtype(dtype)), k.fma_signature(dtype),
                              cc=(9, 0))
    lines = ptx.splitlines()
    result[dtype] = {"fma": sum(f"fma.rn.{'f32' if dtype == 'float32' else 'f64'}" in l
                                for l in lines),
                     "f64": [l.strip() for l in lines if ".f64" in l]}
ptx, _ = cuda.compile_ptx(k.blocker_source, k.BLOCKER_SIGNATURE, cc=(7, 5))
result["blocker_nanosleep"] = "nanosleep" in ptx
print(json.dumps(result))
"""


def test_fma_kernel_and_blocker_compile_to_ptx():
    """The real compiler (no GPU needed): 8 FMAs per iteration, none in float64 for float32."""
    result = run_ptx_script(_PTX_SCRIPT)
    assert result["float32"]["fma"] >= gpu_device.FMA_CHAINS
    assert result["float32"]["f64"] == []
    assert result["float64"]["fma"] >= gpu_device.FMA_CHAINS
    assert result["blocker_nanosleep"]


def test_importing_gpu_timing_does_not_import_numba_cuda():
    code = ("import sys, attnbench.measure.gpu_timing, attnbench.sweep.runner; "
            "print('numba.cuda' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


# --- a point on the device (or in the simulator) -----------------------------------------------


@needs_cuda
def test_prepare_launch_launches_again_without_copies():
    from numba import cuda

    from attnbench.kernels.cuda import launch as cuda_backend

    q, k, v, kwargs = make_inputs(Point("cuda", 9, 3, 2, 1, 2, "bool", "float32"))
    q_dev, k_dev, v_dev = (cuda.to_device(x) for x in (q, k, v))
    expected = cuda_backend.attention_device(q_dev, k_dev, v_dev, **kwargs).copy_to_host()
    launch, out = cuda_backend.prepare_launch(q_dev, k_dev, v_dev, **kwargs)
    launch()
    np.testing.assert_array_equal(out.copy_to_host(), expected)
    out_again = cuda.device_array_like(out)
    cuda_backend.prepare_launch(q_dev, k_dev, v_dev, out=out_again, **kwargs)[0]()
    np.testing.assert_array_equal(out_again.copy_to_host(), expected)


@needs_cuda
@pytest.mark.parametrize("mask", ["none", "causal", "padding", "bool"])
def test_a_cuda_point_is_timed_on_device_arrays_and_checked(mask):
    runner = PointRunner(max_time=0.005, gemm_peaks={"float32": 1.0}, settle=0.0,
                         allow_simulator=True)
    row = runner(Point("cuda", 8, 4, 2, 1, 2, mask, "float32"))
    assert row["status"] == "ok", row["reason"]
    assert row["max_abs_err"] <= row["tolerance"]  # the output of the device arrays
    for column in ("median_ms", "h2d_ms", "d2h_ms", "host_call_ms"):
        assert row[column] > 0, column
    assert row["h2d_gbps"] > 0 and row["d2h_gbps"] > 0
    assert row["device"] == gpu_device.device_label()
    if SIMULATOR:
        assert "simulator" in row["timing_method"] and "NOT GPU time" in row["timing_method"]
        assert np.isnan(row["gemm_peak_gflops"]) and "simulator" in row["peak_source"]
    else:
        assert row["timing_method"].startswith("CUDA events")
        assert row["gemm_peak_gflops"] > 0


@pytest.mark.skipif(not SIMULATOR, reason="checks the simulator's refusal")
def test_a_sweep_skips_cuda_in_the_simulator_unless_allowed():
    runner = PointRunner(max_time=0.005, gemm_peaks={}, settle=0.0)
    row = runner(Point("cuda", 8, 4, 1, 1, 1, "none", "float32"))
    assert row["status"] == "skipped" and "real GPU" in row["reason"]
    assert "simulator" in row["reason"]


def test_torch_cuda_is_skipped_with_the_reason_without_a_gpu_torch():
    usable, why = gpu_device.backend_status("torch-cuda")
    if usable:
        pytest.skip(f"torch sees a GPU here: {why}")
    row = PointRunner(max_time=0.005, gemm_peaks={}, settle=0.0)(
        Point("torch-cuda", 8, 4, 1, 1, 1, "none", "float32"))
    assert row["status"] == "skipped" and row["reason"] == f"skipped: {why}"
    with pytest.raises(ValueError, match="not a GPU backend"):
        gpu_device.backend_status("numba")


# --- only on a real GPU ---------------------------------------------------------------------


@gpu_only
def test_fma_peak_is_near_the_theoretical_peak():
    record = gpu_device.device_record()
    theoretical = record["fp32_peak_theoretical_gflops"]
    measured = gpu_device.fma_peak_gflops(np.float32)
    print(f"{record['name']}: FMA kernel {measured:.0f} GFLOP/s, theoretical {theoretical:.0f}")
    assert measured > 0
    if np.isfinite(theoretical):  # clocks may throttle below the boost clock, never above
        assert 0.5 * theoretical < measured < 1.05 * theoretical
    assert gpu_device.fma_peak_gflops(np.float64) > 0


@gpu_only
def test_events_time_a_larger_point_and_copies_apart():
    q, k, v, kwargs = make_inputs(Point("cuda", 1024, 64, 4, 4, 1, "causal", "float32"))
    timed = gpu_timing.time_attention("cuda", q, k, v, kwargs, max_time=0.2)
    assert timed.kernel.median > 0 and timed.kernel.runs >= 3
    assert timed.h2d.median > 0 and timed.d2h.median > 0
    assert timed.host_call.median > timed.kernel.median  # copies and checks on top
    assert timed.timing_method.startswith("CUDA events")
    print(timed.columns(), f"kernel {timed.kernel}")
