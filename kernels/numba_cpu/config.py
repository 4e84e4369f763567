"""Block sizes and thresholds of the ``numba`` backend, in one place.

The kernels read them at call time (``config.BLOCK_K``), so that a test can patch one
(``monkeypatch.setattr(kernels.numba_cpu.config, "BLOCK_K", 16)``) and reach every path.
"""

from __future__ import annotations

import importlib.util

# --- the forward kernel (kernels.numba_cpu.dense.forward) -------------------------------------

#: Query rows per parallel task: K and V tiles are reused across these rows.
BLOCK_Q = 512
#: Smallest query block: smaller problems get smaller blocks, down to this, until each
#: thread has two tasks (see :func:`kernels.numba_cpu.dense.forward.block_rows`).
MIN_BLOCK_Q = 32
#: Keys per tile of the online softmax.
BLOCK_K = 256
#: Keys per tile where a tile crosses the causal diagonal (less of the triangle wasted).
BLOCK_K_DIAGONAL = 64
#: Problems with fewer multiply-adds than this (``AttentionProblem.work``) run on the
#: calling thread: starting the thread pool costs more than it saves (two threads win from
#: about 2**20 on, when there are tasks for both).
SERIAL_WORK_LIMIT = 1 << 20

# --- with a mask_mod (kernels.numba_cpu.dense.mods) -------------------------------------------

#: Query rows per task when a mask function is given, unless larger blocks compute no
#: more pairs (see :func:`kernels.numba_cpu.dense.mods.mask_block_rows`): a block of 64 rows
#: under a window of W keys reads ~W + 64 keys per row.
MOD_BLOCK_Q = 64
#: Keys per cell: the unit of the tile classification.
CELL_K = 64

# --- the backward kernel (kernels.numba_cpu.dense.backward) -----------------------------------

#: Query rows per tile.
BACKWARD_BLOCK_Q = 128
#: Keys per block: the unit of work that owns its dK and dV.  Of (BLOCK_Q, BLOCK_K) in
#: {64, 128, 256}², (128, 64) took the least CPU time at L = 2048, D = 64 on one thread,
#: (64, 128) and (64, 64) within a few percent, (128, 128) a quarter more; causal alike.
BACKWARD_BLOCK_K = 64
#: Problems with fewer multiply-adds than this run on the calling thread.
BACKWARD_SERIAL_WORK_LIMIT = 1 << 20
#: Tasks that ``deterministic=True`` aims at, in place of two per thread (see
#: :func:`kernels.numba_cpu.dense.backward.key_chunks`): the key blocks of fewer (batch, kv
#: head) pairs than this are split into chunks, so dQ is summed in an order fixed by the
#: problem alone.  8, the split the default makes on four threads (which then gives the same
#: bits): one pair still gets eight tasks (four for each thread of two, two for each of
#: four), two pairs four chunks each, and the dQ parts (chunks x pairs of them, each
#: group x Lq x D) stay under sixteen of one pair's dQ.  More threads than eight find idle
#: ones on so few pairs: the price of bits that do not depend on the thread count.
BACKWARD_DETERMINISTIC_TASKS = 8

# --- the tile products ------------------------------------------------------------------------

#: True when Numba's ``np.dot`` can call a BLAS (it needs SciPy's ``cython_blas``) and
#: threadpoolctl can hold that BLAS to one thread inside Numba's threads.
HAVE_BLAS = all(importlib.util.find_spec(name) is not None for name in ("scipy", "threadpoolctl"))
