"""The classes of a tile of (query, key) pairs under a mask function, as the kernels compare
them (int64): EMPTY (no pair visible: skipped), PARTIAL (check every pair), FULL (every
pair visible: no per-element check)."""

EMPTY, PARTIAL, FULL = 0, 1, 2
