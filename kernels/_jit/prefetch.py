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
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from . import cache  # noqa: F401  (before any cached function: see that module)

#: Bytes of a cache line (x86-64 and the ARM cores Numba targets).
CACHE_LINE = 64


def prefetch_line(builder, address):
    """LLVM IR: ``llvm.prefetch`` of the line holding ``address`` (an ``i8*``), for
    reading, into L2 and the levels below it, not L1 (the intrinsics that prefetch inside
    their own loops call it too)."""
    i32 = ir.IntType(32)
    hint = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VoidType(), [address.type, i32, i32, i32]),
        "llvm.prefetch.p0")
    # (address, read, locality 2, data cache): into L2 (x86 prefetcht1), not L1.  A
    # chunk prefetched ahead (64 keys of K and V: 32-64 KiB) does not fit L1 beside the
    # rows in use, and into L1 (locality 3) it evicted them: a decode step over a long
    # cache was about a quarter slower with L1 prefetches (docs/guide/decode.md).
    builder.call(hint, [address, ir.Constant(i32, 0), ir.Constant(i32, 2),
                        ir.Constant(i32, 1)])


def _element_address(context, builder, array_type, array, offset, offset_type):
    """``i8*`` to flat element ``offset`` of ``array``'s data (no bounds check)."""
    data = context.make_array(array_type)(context, builder, array).data
    index = context.cast(builder, offset, offset_type, types.int64)
    return builder.bitcast(builder.gep(data, [index]), ir.IntType(8).as_pointer())


@intrinsic
def prefetch_rows(typingctx, arr, first, count, row_size):
    """``prefetch_rows(arr, first, count, row_size)``: prefetch ``count`` consecutive rows
    of ``row_size`` elements of C-contiguous ``arr``, starting at flat element ``first``,
    one hint per cache line (into L2).

    An intrinsic, not an ``@njit`` function: a jitted helper costs, per call (twice per
    key in the decode kernel), a reference count increment and decrement of the array
    (calls into Numba's runtime, atomic) and two integer divisions (the line step from
    the item size, read at run time, and the trip count).  Here the step is a constant
    of the array's type and the loop counts bytes, which makes the decode scores with
    their prefetches about a quarter faster per key in L2.  From memory the prefetches
    are best spread out: a chunk's prefetches all issued during its scores fill the
    core's miss buffers while the scores wait for their own rows, so the key rows'
    prefetches go in the scores and the value rows' in the values' product
    (:mod:`kernels.numba_cpu.decode.chunks`, runs of 4 KiB; docs/guide/decode.md)."""
    if not isinstance(arr, types.Array) or not all(
            isinstance(x, types.Integer) for x in (first, count, row_size)):
        return None

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        array_type = signature.args[0]
        itemsize = context.get_abi_sizeof(context.get_value_type(array_type.dtype))
        start = _element_address(context, builder, array_type, args[0], args[1],
                                 signature.args[1])
        count_, size_ = (context.cast(builder, args[i], signature.args[i], types.int64)
                         for i in (2, 3))
        nbytes = builder.mul(builder.mul(count_, size_), ir.Constant(i64, itemsize))
        with cgutils.for_range_slice(builder, ir.Constant(i64, 0), nbytes,
                                     ir.Constant(i64, CACHE_LINE), intp=i64) as (offset, _):
            prefetch_line(builder, builder.gep(start, [offset]))
        return context.get_dummy_value()

    return types.void(arr, first, count, row_size), codegen
