"""Register-blocked products written as LLVM intrinsics (no kernel of their own).

- :mod:`.intrinsics`: the tile product and the row dots, accumulators held in vector
  registers across a whole depth;
- :mod:`.blocks`: dot products of a block of rows with a block of key rows;
- :mod:`.pairs`: the same products on pairs of bfloat16 values.
"""
