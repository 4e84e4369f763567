"""The target Numba compiles for (``kernels._jit.isa``), and the forms chosen from it:
what the machine record reports, and the same answer in a process told to compile for an
AVX2 machine (``AVX2_TARGET``), whatever this machine is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnbench import kernels
from attnbench.kernels._jit import isa
from attnbench.measure.machine import machine_record, summary_lines

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("features, bits, registers, name", [
    ("+avx,+avx2,+fma,-avx512f,-avx512bf16", 256, 16, "avx2"),
    ("+avx,+avx2,+avx512f,+avx512bf16", 512, 32, "avx512"),
    ("+sse2,+sse4.2", 128, 16, "sse"),
    ("+neon,+fp-armv8", 128, 32, "neon"),
    ("", 128, 16, "sse"),
])
def test_vector_registers_follow_the_enabled_features(features, bits, registers, name):
    target = isa.Target("cpu", isa._parse_features(features), features, overridden=False)
    assert (target.vector_bits, target.vector_registers, target.vector_isa) == (
        bits, registers, name)
    assert not target.has("avx512f") or bits == 512  # "-avx512f" disables, "+" enables


def test_require_names_the_instruction_and_the_target():
    with pytest.raises(NotImplementedError, match="vpmadd52 needs the CPU feature nope"):
        isa.require("nope", "vpmadd52")
    isa.require("avx2" if isa.target().has("avx2") else next(iter(isa.target().features)),
                "any")


def test_the_record_says_which_forms_are_compiled():
    forms = machine_record()["compiled_forms"]
    assert forms == kernels.compiled_forms()
    assert forms["target"] == isa.target().describe()
    assert forms["bfloat16_products"] in ("vdpbf16ps", "emulated")
    if forms["bfloat16_products"] == "vdpbf16ps":
        assert isa.target().has("avx512bf16")
    assert set(forms["micro_blocks"]) == {"float32", "float64"}
    assert any(line.startswith("Target ") and forms["target"] in line
               for line in summary_lines())


_FORMS = "import json, kernels; print(json.dumps(kernels.compiled_forms()))"


def test_an_avx2_target_is_seen_as_one_on_any_machine(tmp_path):
    env = {**os.environ, **isa.AVX2_TARGET, "NUMBA_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", _FORMS], env=env, capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    forms = json.loads(done.stdout)
    assert forms["target"].startswith("haswell (NUMBA_CPU_NAME/NUMBA_CPU_FEATURES): avx2, "
                                      "16 x 256-bit")
    assert forms["bfloat16_products"] == "emulated"
    assert forms["micro_blocks"] == {"float32": ["6x16", "4x24"], "float64": ["6x8", "4x12"]}


def test_ci_compiles_for_the_same_avx2_target():
    """.ci/run's AVX2 lane sets the same two variables the tests use."""
    ci = (ROOT / ".ci" / "run").read_text()
    for name, value in isa.AVX2_TARGET.items():
        assert f"{name}={value}" in ci
