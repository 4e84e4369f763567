"""The problems every experiment runs: one input generator, one list of mask kinds.

The agreement table, the sweeps, the bench, the benchmarks and the test suite all draw
their attention problems here, so "a bool mask" or "padding" means the same thing
everywhere.  A problem is a :class:`ProblemSpec` (sizes and masking options);
:func:`make_inputs` turns it into ``q, k, v`` and the keyword arguments of
:func:`kernels.attention`.  Mask *kinds* (:data:`MASK_KINDS`) are named specs' masking
options, the vocabulary of the grids and of the CLI's ``--mask``.

Also here, because every experiment needs them the same way: :func:`limit_threads`
(Numba, the BLAS and OpenMP pools, torch), :func:`timing_threads` (the BLAS threads a
backend is timed with), :func:`load_average`, and the tuning constants shared by every
timer (:data:`SETTLE_SECONDS`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from dataclasses import dataclass, field

import numba
import numpy as np
from threadpoolctl import threadpool_limits

from attnbench.measure.peer_formulas import torch_status

__all__ = [
    "BOOL_MASK_DENSITY", "DROPOUT_P", "MASK_KINDS", "SEED", "SETTLE_SECONDS", "ProblemSpec",
    "ONE_BLAS_THREAD_BACKENDS", "limit_threads", "load_average", "make_inputs",
    "mask_options", "timing_threads",
]

#: Seed of every random input; each problem mixes in its own sizes and options.
SEED = 0
#: Probability that an entry of a random bool mask is True (visible).
BOOL_MASK_DENSITY = 0.7
#: Dropout probability of the "dropout" mask kind.
DROPOUT_P = 0.1
#: Pause (s) before timing each backend: OpenBLAS's workers spin for a while after a call.
SETTLE_SECONDS = 0.2

#: Mask kinds, each applied alone, and what they pass to :func:`kernels.attention`.
MASK_KINDS = (
    "none",  # full attention
    "causal",  # causal=True: query i sees keys j <= i
    "bottom-right",  # causal="bottom-right": query i sees keys j <= i + Lk - Lq
    "bool",  # a random bool mask, BOOL_MASK_DENSITY visible, one per batch (shared by heads)
    "key_lengths",  # random key lengths in [1, Lk] per batch
    "padding",  # the last quarter of the keys padded (key_lengths = Lk - Lk // 4)
    "dropout",  # dropout_p=DROPOUT_P with a fixed seed (no mask)
)


@dataclass(frozen=True)
class ProblemSpec:
    """One attention problem: sizes and masking options (what, not the values).

    The masking fields combine (all apply), as the arguments of :func:`kernels.attention`.
    """

    name: str = ""
    B: int = 1  # batch
    H: int = 2  # query heads
    Hkv: int | None = None  # key/value heads (None: H); H // Hkv queries share one
    Lq: int = 7  # queries
    Lk: int | None = None  # keys (None: Lq)
    D: int = 8  # head size of q and k
    Dv: int | None = None  # head size of v (None: D)
    causal: bool | str = False  # as kernels.attention's causal
    mask: str | None = None  # None, "bool" (B, H, Lq, Lk), "bool-shared" (B, 1, Lq, Lk),
    # "float" (additive, some -inf), "padding" (bool (B, 1, 1, Lk)), "empty-rows" (every
    # third query sees nothing)
    key_lengths: str | None = None  # None, "random" in [1, Lk], "with-zero" (batch 0 sees
    # nothing), "quarter" (the last quarter padded)
    dropout_p: float = 0.0
    scale: float | None = None
    extra: dict = field(default_factory=dict)  # more keyword arguments, passed as they are

    @property
    def sizes(self) -> tuple[int, int, int, int, int, int, int]:
        """``(B, H, Hkv, Lq, Lk, D, Dv)`` with the defaults filled in."""
        Lk = self.Lq if self.Lk is None else self.Lk
        return self.B, self.H, self.Hkv or self.H, self.Lq, Lk, self.D, self.Dv or self.D

    @property
    def shapes(self) -> tuple[tuple, tuple, tuple]:
        """Shapes of q ``(B, H, Lq, D)``, k ``(B, Hkv, Lk, D)`` and v ``(B, Hkv, Lk, Dv)``."""
        B, H, Hkv, Lq, Lk, D, Dv = self.sizes
        return (B, H, Lq, D), (B, Hkv, Lk, D), (B, Hkv, Lk, Dv)

    def with_mask_kind(self, kind: str) -> ProblemSpec:
        """This spec with the masking options of mask kind ``kind`` (see :data:`MASK_KINDS`)."""
        return dataclasses.replace(self, **mask_options(kind))


def mask_options(kind: str) -> dict:
    """The :class:`ProblemSpec` fields of mask kind ``kind``, one of :data:`MASK_KINDS`."""
    options = {
        "none": {},
        "causal": {"causal": True},
        "bottom-right": {"causal": "bottom-right"},
        "bool": {"mask": "bool-shared"},
        "key_lengths": {"key_lengths": "random"},
        "padding": {"key_lengths": "quarter"},
        "dropout": {"dropout_p": DROPOUT_P},
    }
    if kind not in options:
        raise ValueError(f"mask kind {kind!r} is unknown; expected one of {MASK_KINDS}")
    return options[kind]


def _rng(spec: ProblemSpec, seed) -> np.random.Generator:
    if isinstance(seed, np.random.Generator):
        return seed
    return np.random.default_rng([SEED, *spec.sizes, int(seed)])


def make_inputs(spec: ProblemSpec, dtype, seed: int | np.random.Generator = 0):
    """Random ``q, k, v`` of ``spec`` in ``dtype`` and the keyword arguments it implies.

    Parameters
    ----------
    spec : ProblemSpec
    dtype : numpy dtype
        float32 or float64.  Values are drawn in float64 and rounded, so both dtypes see
        the same problem.
    seed : int or numpy.random.Generator, default 0
        Reproducible: the same spec, dtype and seed give the same arrays.

    Returns
    -------
    q, k, v : ndarray
        ``(B, H, Lq, D)``, ``(B, Hkv, Lk, D)``, ``(B, Hkv, Lk, Dv)``.
    kwargs : dict
        ``causal``, ``mask``, ``key_lengths``, ``dropout_p``/``seed``, ``scale`` and
        ``extra``, as :func:`kernels.attention` takes them (only those that are set).
    """
    rng = _rng(spec, seed)
    q_shape, k_shape, v_shape = spec.shapes
    q = rng.standard_normal(q_shape).astype(dtype)  # (B, H, Lq, D)
    k = rng.standard_normal(k_shape).astype(dtype)  # (B, Hkv, Lk, D)
    v = rng.standard_normal(v_shape).astype(dtype)  # (B, Hkv, Lk, Dv)
    B, H, _, Lq, Lk, _, _ = spec.sizes
    kwargs = dict(spec.extra)
    if spec.causal is not False:
        kwargs["causal"] = spec.causal
    if spec.scale is not None:
        kwargs["scale"] = spec.scale
    if spec.mask is not None:
        kwargs["mask"] = _mask(spec.mask, rng, B, H, Lq, Lk, dtype)
    if spec.key_lengths is not None:
        kwargs["key_lengths"] = _key_lengths(spec.key_lengths, rng, B, Lk)
    if spec.dropout_p:
        kwargs["dropout_p"] = spec.dropout_p
        kwargs["seed"] = int(rng.integers(2**32))
    return q, k, v, kwargs


def _mask(kind: str, rng: np.random.Generator, B: int, H: int, Lq: int, Lk: int, dtype):
    if kind == "bool":
        return rng.random((B, H, Lq, Lk)) < BOOL_MASK_DENSITY  # (B, H, Lq, Lk)
    if kind == "bool-shared":
        return rng.random((B, 1, Lq, Lk)) < BOOL_MASK_DENSITY  # (B, 1, Lq, Lk)
    if kind == "float":
        additive = rng.standard_normal((1, H, Lq, Lk))  # (1, H, Lq, Lk)
        additive[rng.random(additive.shape) < 1 - BOOL_MASK_DENSITY] = -np.inf
        return additive.astype(dtype)
    if kind == "padding":
        return np.arange(Lk) < rng.integers(0, Lk + 1, size=(B, 1, 1, 1))  # (B, 1, 1, Lk)
    if kind == "empty-rows":
        mask = rng.random((B, H, Lq, Lk)) < 0.5  # (B, H, Lq, Lk)
        mask[:, :, ::3, :] = False  # every third query sees nothing
        return mask
    raise ValueError(f"mask={kind!r} is unknown; expected 'bool', 'bool-shared', 'float', "
                     "'padding' or 'empty-rows'")


def _key_lengths(kind: str, rng: np.random.Generator, B: int, Lk: int) -> np.ndarray:
    if kind == "random":
        return rng.integers(1, Lk + 1, size=B) if Lk else np.zeros(B, np.int64)
    if kind == "with-zero":
        lengths = rng.integers(0, Lk + 1, size=B)
        lengths[0] = 0
        return lengths
    if kind == "quarter":
        return np.full(B, Lk - Lk // 4, dtype=np.int64)
    raise ValueError(f"key_lengths={kind!r} is unknown; expected 'random', 'with-zero' or "
                     "'quarter'")


def load_average() -> float:
    """The 1-minute load average (nan where the OS has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return float("nan")


#: Backends timed with the BLAS on one thread whatever the sweep's thread count: the
#: reference, the oracle (its time is a question of scaling, not of speed).  Its products
#: are small (L x d_k by d_k x L per head) and, on two threads, OpenBLAS's workers share
#: packed panels and synchronise several times per product: on the 2-vCPU machine this
#: suite was measured on, they ran 1.4-2x slower for stretches of seconds (both threads
#: running, no run-queue wait, each vCPU alone as fast as ever: only their cooperation
#: slowed), which bent the reference's L fit; one thread was not affected, and its CPU
#: time is the call's work, not a spinning worker's (docs/design.md, Measuring).
ONE_BLAS_THREAD_BACKENDS = frozenset({"reference"})


@contextlib.contextmanager
def timing_threads(backend: str):
    """Within it, the thread limit ``backend`` is timed under: the BLAS on one thread for
    the :data:`ONE_BLAS_THREAD_BACKENDS`, nothing changed for the others; restored on exit."""
    if backend not in ONE_BLAS_THREAD_BACKENDS:
        yield
        return
    with threadpool_limits(limits=1, user_api="blas"):
        yield


@contextlib.contextmanager
def limit_threads(threads: int | None, *, torch: bool = False):
    """At most ``threads`` threads in Numba (this thread's launches), the BLAS and OpenMP
    pools and, with ``torch=True`` and torch installed, torch; restored on exit.

    ``threads=None`` changes nothing.
    """
    if threads is None:
        yield
        return
    if not 1 <= threads <= numba.config.NUMBA_NUM_THREADS:
        raise ValueError(f"threads must lie in [1, {numba.config.NUMBA_NUM_THREADS}] (Numba's "
                         f"NUMBA_NUM_THREADS); got {threads}")
    numba_before = numba.get_num_threads()
    torch_module = None
    if torch and torch_status()[0]:
        import torch as torch_module  # optional peer: imported only when asked for

        torch_before = torch_module.get_num_threads()
        torch_module.set_num_threads(threads)
    numba.set_num_threads(threads)
    try:
        with threadpool_limits(limits=threads):
            yield
    finally:
        numba.set_num_threads(numba_before)
        if torch_module is not None:
            torch_module.set_num_threads(torch_before)
