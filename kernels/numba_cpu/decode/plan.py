"""How the numba decode kernel (:mod:`kernels.numba_cpu.decode.attend`) divides a step into
parallel tasks: how many key splits per sequence for ``num_splits=0``, and whether a task
takes one key/value head or every head of its split.  Plain Python, no compiled code.

Only the split count can change a result's bits: ``deterministic=True`` fixes it (and the
split size) from each sequence's length alone.  :func:`heads_per_task` follows the thread
count in both modes and changes no bit (each head's arithmetic is the same either way)."""

from __future__ import annotations

import numba

from ..._problems.decode import DecodeProblem

#: num_splits=0 splits until there are this many tasks per thread ...
TASKS_PER_THREAD = 4
#: ... but keeps at least this many keys per split.
MIN_KEYS_PER_SPLIT = 512
#: A paged cache whose runs (one head's keys on one page) are this long or shorter is read
#: a page at a time for every key/value head together (the heads' runs of a page are
#: adjacent): runs of 8 KiB read in shuffled order, one head at a time, cost the memory
#: system alone clearly more than the contiguous read (docs/guide/decode.md, "What it
#: costs").
HEADS_TOGETHER_RUN_BYTES = 16384


def reads_heads_together(problem: DecodeProblem) -> bool:
    """Whether a task takes every key/value head of its keys: for a cache whose runs (one
    head's keys on one page; a contiguous cache is one page per sequence) hold at most
    ``HEADS_TOGETHER_RUN_BYTES``."""
    page_size, D = problem.k_cache.shape[2], problem.k_cache.shape[3]
    return page_size * D * problem.k_cache.itemsize <= HEADS_TOGETHER_RUN_BYTES


def choose_splits(problem: DecodeProblem, threads: int | None = None) -> int:
    """Splits per sequence for ``num_splits=0``: enough tasks for every thread
    (``TASKS_PER_THREAD`` each), at least ``MIN_KEYS_PER_SPLIT`` keys per split; a task
    is a sequence's split for one key/value head, or for all of them where
    :func:`reads_heads_together`.  With ``deterministic`` the splits are
    :meth:`DecodeProblem.split_keys` keys each (the kernel's ``split_keys``), whatever
    the threads: as many as the longest sequence needs."""
    if problem.num_splits:
        return problem.num_splits
    if problem.deterministic:
        return problem.fixed_splits()
    B, _, Hkv, _, _, _ = problem.shape
    threads = numba.get_num_threads() if threads is None else threads
    longest = int(problem.seqlens.max(initial=0))
    per_split = B if reads_heads_together(problem) else B * Hkv
    wanted = -(-TASKS_PER_THREAD * threads // max(per_split, 1))
    return max(1, min(wanted, longest // MIN_KEYS_PER_SPLIT))


def heads_per_task(problem: DecodeProblem, n_splits: int,
                   threads: int | None = None) -> int:
    """Every key/value head in one task where :func:`reads_heads_together` and there are
    still ``TASKS_PER_THREAD`` tasks for every thread (B · n_splits of them), so that the
    threads stay balanced; else one head per task.  The result does not depend on it (the
    same chunks, in the same order, for every head)."""
    Hkv = problem.shape[2]
    threads = numba.get_num_threads() if threads is None else threads
    if (reads_heads_together(problem)
            and problem.shape[0] * n_splits >= TASKS_PER_THREAD * threads):
        return Hkv
    return 1
