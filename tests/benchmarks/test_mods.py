"""The built-ins of :mod:`kernels.mods` per backend and shape (``pytest --benchmark``).

Each built-in is timed through ``kernels.attention(..., mask_mod=...)`` or
``score_mod=...`` beside the plain call of the same shape (grouped by shape: the group
shows what a function costs).  GFLOP/s count the pairs a mask leaves visible (from its
dense form, :meth:`kernels.mods.MaskMod.dense`); the error is against the float64 oracle,
which evaluates the functions densely.
"""

import functools

import numpy as np
import pytest

from attnbench import kernels
from attnbench.kernels import mods
from attnbench.measure.flops import attention_flops
from attnbench.measure.oracle import max_abs_error, oracle, tolerance
from tests.benchmarks.common import GRID, problem, shape_id, timed
from tests.benchmarks.test_attention import SHAPES


def _builtins(B: int, H: int, L: int) -> dict:
    """name -> ``attention`` keywords of each built-in (and the plain call)."""
    return {
        "plain": {},
        "sliding_window": {"mask_mod": mods.sliding_window(L // 4), "causal": True},
        "prefix_lm": {"mask_mod": mods.prefix_lm(np.full(B, L // 4))},
        "document": {"mask_mod": mods.document(np.repeat(np.arange(4), -(-L // 4))[None, :L]
                                               .repeat(B, axis=0))},
        "alibi": {"score_mod": mods.alibi(2.0 ** -np.arange(1, H + 1))},
        "softcap": {"score_mod": mods.softcap(20.0)},
        "relative_bias": {"score_mod": mods.relative_bias(
            np.random.default_rng(0).standard_normal((H, 2 * 8 + 1)))},
    }


MODS = list(_builtins(1, 1, 8))
BACKENDS = ["numba", "reference"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", MODS)
@pytest.mark.parametrize("shape", SHAPES[GRID], ids=shape_id)
def test_mod(benchmark, shape, name, backend):
    point, q, k, v, _ = problem(backend, shape, "none")
    B, H, L = point.batch, point.heads, point.L
    kwargs = _builtins(B, H, L)[name]
    fn = functools.partial(kernels.attention, q, k, v, backend=backend, **kwargs)
    out = fn()
    exact, plain = oracle(kernels.prepare(q, k, v, **kwargs))
    visible = kwargs["mask_mod"].dense(B, H, L, L) if "mask_mod" in kwargs else None
    flops = attention_flops(B, H, L, L, point.d_k, causal=kwargs.get("causal", False),
                            mask=visible)
    timed(benchmark, fn, point, flops, max_abs_error(out, exact),
          tolerance(exact, plain, q.dtype), group=" mods", mod=name)
