"""The machine Numba compiles for: its CPU name, features and vector registers.

Numba compiles every kernel for one target: the host CPU, or the one named by
``NUMBA_CPU_NAME`` and ``NUMBA_CPU_FEATURES`` (set both to compile for another machine:
with the name alone Numba keeps the host's features).  A kernel that emits an
instruction of one instruction set (``vdpbf16ps`` of AVX512-BF16) must choose that form
at compile time from this target, and the IR helper that emits it calls :func:`require`
first: LLVM, handed an intrinsic the target lacks, aborts the whole process (``LLVM
ERROR: Do not know how to split the result of this operator!``) instead of raising.

A feature counts as present only where the target's feature string enables it
(``+avx512bf16``); the features a CPU name implies without listing them are not read,
so such a target gets the portable forms (slower, never wrong).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

__all__ = ["AVX2_TARGET", "Target", "require", "target"]

#: The environment that makes Numba compile for an AVX2 machine (Intel Haswell: 16 ymm
#: registers, FMA, no AVX-512) on any x86-64 host: CI's AVX2 lane and the tests that
#: compile in a subprocess for it.  Give it its own ``NUMBA_CACHE_DIR`` too.
AVX2_TARGET = {"NUMBA_CPU_NAME": "haswell",
               "NUMBA_CPU_FEATURES": "+avx,+avx2,+fma,+f16c,+bmi,+bmi2,+popcnt,+sse4.2"}


@dataclass(frozen=True)
class Target:
    """Numba's CPU target.

    Attributes
    ----------
    cpu : str
        LLVM's CPU name (``"znver3"``, ``"haswell"``, ``"sapphirerapids"``).
    features : frozenset of str
        The features the target enables, without their ``+`` (``"avx2"``, ``"fma"``).
    feature_string : str
        LLVM's feature string as Numba passes it (``"+avx,+avx2,-avx512f,..."``).
    overridden : bool
        Whether ``NUMBA_CPU_NAME`` or ``NUMBA_CPU_FEATURES`` set the target (else it is
        the host).
    """

    cpu: str
    features: frozenset
    feature_string: str
    overridden: bool

    def has(self, feature: str) -> bool:
        """Whether the target enables ``feature`` (LLVM's name, e.g. ``"avx512bf16"``)."""
        return feature in self.features

    @property
    def vector_bits(self) -> int:
        """The width of the vector registers the kernels' loops fill: 512 with AVX-512F,
        256 with AVX, else 128 (SSE2 and Arm's NEON)."""
        if self.has("avx512f"):
            return 512
        return 256 if self.has("avx") else 128

    @property
    def vector_registers(self) -> int:
        """Vector registers the target has: 32 with AVX-512F and on 64-bit Arm, else 16
        (x86-64's ymm/xmm)."""
        return 32 if self.has("avx512f") or self.has("neon") else 16

    @property
    def vector_isa(self) -> str:
        """The widest vector instruction set in use: ``"avx512"``, ``"avx2"``, ``"avx"``,
        ``"neon"`` or ``"sse"``."""
        for name, feature in (("avx512", "avx512f"), ("avx2", "avx2"), ("avx", "avx"),
                              ("neon", "neon")):
            if self.has(feature):
                return name
        return "sse"

    def describe(self) -> str:
        """One line: ``"znver3: avx2, 16 x 256-bit vector registers"``."""
        source = " (NUMBA_CPU_NAME/NUMBA_CPU_FEATURES)" if self.overridden else ""
        return (f"{self.cpu}{source}: {self.vector_isa}, {self.vector_registers} x "
                f"{self.vector_bits}-bit vector registers")


def _parse_features(text: str) -> frozenset:
    return frozenset(item[1:] for item in text.split(",") if item.startswith("+"))


@functools.cache
def target() -> Target:
    """The :class:`Target` Numba compiles for in this process (read once: Numba reads its
    configuration at import)."""
    from llvmlite import binding as llvm
    from numba.core import codegen, config

    # What Numba's CPU codegen does: the overrides where set, else the host (less AVX
    # where NUMBA_ENABLE_AVX=0).
    features = (config.CPU_FEATURES if config.CPU_FEATURES is not None
                else codegen.get_host_cpu_features())
    return Target(cpu=config.CPU_NAME or llvm.get_host_cpu_name(),
                  features=_parse_features(features or ""), feature_string=features or "",
                  overridden=config.CPU_NAME is not None or config.CPU_FEATURES is not None)


def require(feature: str, instruction: str) -> None:
    """Refuse to emit ``instruction`` for a target without ``feature``.

    Raises
    ------
    NotImplementedError
        Naming the instruction, the feature and the target, where the target lacks the
        feature (LLVM would abort the process on it).
    """
    here = target()
    if not here.has(feature):
        raise NotImplementedError(
            f"{instruction} needs the CPU feature {feature}, which Numba's target "
            f"({here.describe()}) does not enable; compile the portable form instead")
