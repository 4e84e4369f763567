"""Software prefetch for the numba CPU kernels that stream memory (the decode kernel).

:func:`prefetch_rows` asks the CPU to start loading the cache lines of a row of a
C-contiguous array before the kernel reads it, so that the loads of the next chunk of keys
overlap the arithmetic on this one (``llvm.prefetch``: a hint, never a fault, also past an
array's end).  The hardware prefetchers follow one stream well but start late on each new
run of a paged cache and fall behind when the arithmetic per byte is high (GQA), which is
where a decode step stops being bound by memory.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from . import cache  # noqa: F401  (before any cached function: see that module)

#: Bytes of a cache line (x86-64 and the ARM cores Numba targets).
CACHE_LINE = 64


@intrinsic
def _prefetch_element(typingctx, arr, offset):
    """Prefetch for reading, into L2 (and the levels below it), the line holding flat
    element ``offset`` of ``arr``'s data."""
    if not isinstance(arr, types.Array) or not isinstance(offset, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        index = context.cast(builder, args[1], signature.args[1], types.int64)
        byte_ptr = ir.IntType(8).as_pointer()
        address = builder.bitcast(builder.gep(data, [index]), byte_ptr)
        i32 = ir.IntType(32)
        hint = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [byte_ptr, i32, i32, i32]),
            "llvm.prefetch.p0")
        # (address, read, locality 2, data cache): into L2 (x86 prefetcht1), not L1.  A
        # chunk prefetched ahead (64 keys of K and V: 32-64 KiB) does not fit L1 beside the
        # rows in use, and into L1 (locality 3) it evicted them: the decode step on the
        # 2-core Zen 4 VM, B=1 H=32 Hkv=8 cache 32768, took 14.5 ms (float32) and 8.9 ms
        # (bfloat16) with L1 prefetches, 11.7 and 6.9 ms with these (docs/guide/decode.md).
        builder.call(hint, [address, ir.Constant(i32, 0), ir.Constant(i32, 2),
                            ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.void(arr, offset), codegen


@njit(cache=True, inline="always")
def prefetch_rows(arr, first, count, row_size):
    """Prefetch ``count`` consecutive rows of ``row_size`` elements of C-contiguous ``arr``,
    starting at flat element ``first`` (one hint per cache line)."""
    step = max(1, CACHE_LINE // arr.itemsize)
    for offset in range(first, first + count * row_size, step):
        _prefetch_element(arr, offset)
