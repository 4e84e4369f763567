"""Products of bfloat16 pairs: the decode kernel's two products for bfloat16 caches.

A bfloat16 step reads half the bytes of a float32 one, but with its loads widened to
float32 (:mod:`kernels.numba_cpu.products.intrinsics`) it does the same arithmetic, one fused
multiply-add per product: at GQA 32/8 on two cores that arithmetic, not the memory, sets
its time (docs/guide/decode.md).  Here both products take their operands as
**pairs** of bfloat16 (two in each 32-bit lane) and add two products per lane and step:

- :func:`pair_row_dots`: ``c[r] = a[r, :depth] · b[:depth]`` with ``a`` (the queries) and
  ``b`` (a key row) both bfloat16 bits; lane ``l`` of step ``t`` takes elements
  ``32t + 2l`` and ``32t + 2l + 1``; the 16 lanes are added pairwise at the end;
- :func:`pair_block_dots`: the same for a block of rows and key rows at once (as
  :func:`kernels.numba_cpu.products.blocks.block_dots`: each vector loaded once per step for the
  block, the sums folded together), the same sums bit for bit;
- :func:`pair_rows_product`: ``C[r, cols] += Σ_t w[r, t] · B[rows[t], cols]`` over a
  chunk of keys, ``w`` the softmax weights rounded to bfloat16 (as FlashAttention feeds P
  to its second product) and ``B`` bfloat16 value rows given by index (a paged cache's),
  taken two keys at a time: the rows of keys ``2i`` and ``2i + 1`` interleaved into pairs,
  times the weight pair; an odd last key is paired with zeros (never with a row outside
  the chunk: a NaN there would reach the sum).  It prefetches the rows taken next as it
  goes.

Each step of a lane is :func:`dot_pairs`: ``acc += x_odd · y_odd``, then ``acc += x_even ·
y_even``, each rounded to float32 — the two products are exact in float32 (8-bit
significands), so this is a fused multiply-add per product.  Where the machine has
AVX512-BF16 (and LLVM ≥ 17 types it) that is one ``vdpbf16ps``; elsewhere two fused
multiply-adds on the halves of each lane (a shift and a mask: cheaper than widening).  The
instruction, as Intel defines it, adds in that order and rounds each sum, so the two agree
bit for bit except where the instruction flushes subnormal inputs and results to zero
(``tests/test_pair_products.py`` compares them on the machine it runs on).

Compile-time constants (Numba literals): ``mr``, ``ncols`` and ``native``.  No bounds
checks: the caller guarantees every index is inside its array.
"""

from __future__ import annotations

import functools

import llvmlite.binding as llvm
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ..._jit import isa
from ..._jit.half import is_bfloat16_bits
from ..._jit.prefetch import CACHE_LINE, prefetch_line
from .blocks import _block_literals, block_dots_ir, indices_ok, key_pointers
from .intrinsics import _accumulators, _int64_args, _lanes_added, _literal, _pointer

__all__ = ["LANES", "NATIVE", "NATIVE_INSTRUCTION", "PAIR_BLOCK", "pair_block_dots",
           "pair_row_dots", "pair_rows_product"]

#: float32 lanes of one step (a 512-bit vector: 32 bfloat16 in 16 pairs).
LANES = 16
#: bfloat16 elements per step, and the block of columns the products take.
PAIR_BLOCK = 2 * LANES

def _bfloat_type():
    """LLVM's ``bfloat``, the operand type of ``vdpbf16ps`` since LLVM 17, built on
    llvmlite's private float base (llvmlite has no such type); None where that is missing
    (then the kernels use the emulation)."""
    try:
        from llvmlite.ir.types import _BaseFloatType
    except ImportError:
        return None

    class BFloatType(_BaseFloatType):
        null = "0.0"
        intrinsic_name = "bf16"

        def __str__(self):
            return "bfloat"

    BFloatType._create_instance()
    return BFloatType()


_BFLOAT = _bfloat_type()
#: The instruction :func:`dot_pairs` emits where :data:`NATIVE`, and LLVM's name of it.
NATIVE_INSTRUCTION = "vdpbf16ps (llvm.x86.avx512bf16.dpbf16ps.512)"
#: Whether the kernels use the instruction (else its emulation): where Numba's target has
#: AVX512-BF16 and its LLVM (17 and later) takes ``<32 x bfloat>`` operands.  A module
#: constant, so that Numba folds the choice and never compiles the other form.
NATIVE = (llvm.llvm_version_info >= (17,) and _BFLOAT is not None
          and isa.target().has("avx512bf16"))


def dot_pairs(builder, acc, x, y, native):
    """LLVM IR: ``acc`` (``<16 x float>``) plus, in each lane, the products of the lane's
    two bfloat16 of ``x`` and ``y`` (``<16 x i32>``, the even element in the low half):
    the odd pair's product added first, then the even pair's.

    ``native``: one ``vdpbf16ps``, else two fused multiply-adds.  The instruction is
    refused (``NotImplementedError``) where :data:`NATIVE` is false: LLVM would abort
    the process on it."""
    f32v = acc.type
    if native:
        isa.require("avx512bf16", NATIVE_INSTRUCTION)
        if not NATIVE:  # the feature is there, but this LLVM or llvmlite cannot type it
            raise NotImplementedError(f"{NATIVE_INSTRUCTION} needs LLVM 17 or later and "
                                      f"llvmlite's float base; compile the emulation")
        bfv = ir.VectorType(_BFLOAT, 2 * LANES)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(f32v, [f32v, bfv, bfv]),
            "llvm.x86.avx512bf16.dpbf16ps.512")
        return builder.call(fn, [acc, builder.bitcast(x, bfv), builder.bitcast(y, bfv)])
    i32v = x.type
    high = ir.Constant(i32v, [0xFFFF0000] * LANES)
    shift = ir.Constant(i32v, [16] * LANES)
    fma = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(f32v, [f32v, f32v, f32v]), "llvm.fma.v16f32")

    def odd(v):
        return builder.bitcast(builder.and_(v, high), f32v)

    def even(v):
        return builder.bitcast(builder.shl(v, shift), f32v)

    acc = builder.call(fma, [odd(x), odd(y), acc])
    return builder.call(fma, [even(x), even(y), acc])


def _bits_ok(*arrays) -> bool:
    return all(isinstance(a, types.Array) and is_bfloat16_bits(a.dtype) for a in arrays)


def _blocks(*literals):
    values = [_literal(x, kind) for x, kind in literals]
    return None if None in values else values


def _vector_at(builder, base, offset, vec, align=2):
    return builder.load(builder.bitcast(builder.gep(base, [offset]), vec.as_pointer()),
                        align=align)


@intrinsic
def pair_row_dots(typingctx, a, a0, lda, b, b0, c, c0, ldc, depth, mr, native):
    """``pair_row_dots(a, a0, lda, b, b0, c, c0, ldc, depth, mr, native)``.

    Sets ``c[c0 + r·ldc]`` to ``Σ_t a[a0 + r·lda + t] · b[b0 + t]`` (``t < depth``) for
    ``r < mr``: ``a`` and ``b`` bfloat16 bits (``uint16``), ``c`` float32.  ``depth`` a
    multiple of :data:`PAIR_BLOCK`; ``mr`` and ``native`` compile-time constants."""
    blocks = _blocks((mr, types.IntegerLiteral), (native, types.BooleanLiteral))
    if blocks is None or not _bits_ok(a, b) or not isinstance(c, types.Array):
        return None
    if c.dtype != types.float32:
        return None
    if not all(isinstance(n, types.Integer) for n in (a0, lda, b0, c0, ldc, depth)):
        return None
    sig = types.void(a, a0, lda, b, b0, c, c0, ldc, depth, mr, native)
    return sig, functools.partial(_row_dots_codegen, *blocks)


def _row_dots_codegen(mr, native, context, builder, signature, args):
    i64 = ir.IntType(64)
    ty = signature.args
    a0_, lda_, b0_, c0_, ldc_, depth_ = _int64_args(context, builder, signature, args,
                                                    (1, 2, 4, 6, 7, 8))
    pa = _pointer(context, builder, ty[0], args[0], a0_)
    pb = _pointer(context, builder, ty[3], args[3], b0_)
    pc = _pointer(context, builder, ty[5], args[5], c0_)
    f32v = ir.VectorType(ir.FloatType(), LANES)
    i32v = ir.VectorType(ir.IntType(32), LANES)
    rows_a = [builder.gep(pa, [builder.mul(lda_, ir.Constant(i64, r))]) for r in range(mr)]
    accs = _accumulators(builder, f32v, mr)
    with cgutils.for_range(builder, builder.udiv(depth_, ir.Constant(i64, PAIR_BLOCK))) as loop:
        t = builder.mul(loop.index, ir.Constant(i64, PAIR_BLOCK))
        bv = _vector_at(builder, pb, t, i32v)
        for r in range(mr):
            av = _vector_at(builder, rows_a[r], t, i32v)
            builder.store(dot_pairs(builder, builder.load(accs[r]), av, bv, native), accs[r])
    for r in range(mr):
        scalar = _lanes_added(builder, builder.load(accs[r]), LANES)
        builder.store(scalar, builder.gep(pc, [builder.mul(ldc_, ir.Constant(i64, r))]))
    return context.get_dummy_value()


@intrinsic
def pair_block_dots(typingctx, a, a0, lda, b, rows, j0, ldb, c, c0, ldc, depth, mr, nk,
                    native):
    """``pair_block_dots(a, a0, lda, b, rows, j0, ldb, c, c0, ldc, depth, mr, nk, native)``.

    Sets ``c[c0 + r·ldc + k]`` to ``Σ_t a[a0 + r·lda + t] · b[rows[j0 + k]·ldb + t]``
    (``t < depth``) for ``r < mr``, ``k < nk``: :func:`pair_row_dots` for ``nk`` key rows at
    once, the same sums bit for bit.  ``a`` and ``b`` bfloat16 bits, ``c`` float32;
    ``depth`` a multiple of :data:`PAIR_BLOCK`; ``mr``, ``nk`` and ``native`` compile-time
    constants, ``mr·nk`` a power of two ``<=`` :data:`LANES`."""
    blocks = _block_literals(mr, nk, types.IntegerLiteral(LANES))
    native_ = _literal(native, types.BooleanLiteral)
    if blocks is None or native_ is None or not _bits_ok(a, b):
        return None
    if not isinstance(c, types.Array) or c.dtype != types.float32:
        return None
    if not indices_ok(rows, (a0, lda, j0, ldb, c0, ldc, depth)):
        return None
    sig = types.void(a, a0, lda, b, rows, j0, ldb, c, c0, ldc, depth, mr, nk, native)
    return sig, functools.partial(_block_dots_codegen, blocks[0], blocks[1], native_)


def _block_dots_codegen(mr, nk, native, context, builder, signature, args):
    i64 = ir.IntType(64)
    ty = signature.args
    a0_, lda_, j0_, ldb_, c0_, ldc_, depth_ = _int64_args(context, builder, signature, args,
                                                          (1, 2, 5, 6, 8, 9, 10))
    pa = _pointer(context, builder, ty[0], args[0], a0_)
    pb = _pointer(context, builder, ty[3], args[3], ir.Constant(i64, 0))
    pc = _pointer(context, builder, ty[7], args[7], c0_)
    f32 = ir.FloatType()
    f32v = ir.VectorType(f32, LANES)
    i32v = ir.VectorType(ir.IntType(32), LANES)
    rows_a = [builder.gep(pa, [builder.mul(lda_, ir.Constant(i64, r))]) for r in range(mr)]
    rows_b = key_pointers(context, builder, ty[4], args[4], j0_, ldb_, pb, nk)
    accs = _accumulators(builder, f32v, mr * nk)
    with cgutils.for_range(builder, builder.udiv(depth_, ir.Constant(i64, PAIR_BLOCK))) as loop:
        t = builder.mul(loop.index, ir.Constant(i64, PAIR_BLOCK))
        bvs = [_vector_at(builder, row, t, i32v) for row in rows_b]
        for r in range(mr):
            av = _vector_at(builder, rows_a[r], t, i32v)
            for k in range(nk):
                acc = accs[r * nk + k]
                builder.store(dot_pairs(builder, builder.load(acc), av, bvs[k], native), acc)
    block_dots_ir(builder, accs, mr, nk, LANES, pc, ldc_, f32, 4)
    return context.get_dummy_value()


#: Shuffle mask interleaving 16 columns of two rows into pairs (row 0's, row 1's).
_INTERLEAVE = [k for col in range(LANES) for k in (col, col + LANES)]

#: In-lane unpacks of 32 columns of two rows (one 64-byte load each) into pairs: lane i of
#: the low half pairs column ``8·(i // 4) + i % 4`` of both rows (``vpunpcklwd``), of the
#: high half that column + 4 (``vpunpckhwd``).  One instruction in each 128-bit lane,
#: where the interleave of 16 columns in natural order (``_INTERLEAVE``) crosses lanes.
_COLUMNS_LOW = [8 * (i // 4) + i % 4 for i in range(LANES)]
_COLUMNS_HIGH = [c + 4 for c in _COLUMNS_LOW]
_UNPACK_LOW = [k for col in _COLUMNS_LOW for k in (col, col + PAIR_BLOCK)]
_UNPACK_HIGH = [k for col in _COLUMNS_HIGH for k in (col, col + PAIR_BLOCK)]
#: The columns of 32 in natural order, from (low, high) accumulators: natural column
#: ``c`` is lane ``_COLUMNS_LOW.index(c)`` of low or ``_COLUMNS_HIGH.index(c)`` of high.
_NATURAL = [(_COLUMNS_LOW.index(c) if c in _COLUMNS_LOW else LANES + _COLUMNS_HIGH.index(c))
            for c in range(PAIR_BLOCK)]


@intrinsic
def pair_rows_product(typingctx, w, w0, ldw, b, rows, nk, col0, ldb, c, c0, ldc, ahead,
                      n_ahead, mr, ncols, native):
    """``pair_rows_product(w, w0, ldw, b, rows, nk, col0, ldb, c, c0, ldc, ahead, n_ahead,
    mr, ncols, native)``.

    Adds to ``c[c0 + r·ldc + j]`` the sum over ``t < nk`` of ``w[w0 + r·ldw + t] ·
    b[rows[t]·ldb + col0 + j]`` for ``r < mr``, ``j < ncols``: ``w`` and ``b`` bfloat16
    bits (``uint16``), ``c`` float32, the value rows given by index (a paged cache's, in
    block-table order), so a whole chunk of keys is one call whatever its pages and its
    accumulators are loaded and stored once.  Keys are taken in pairs (``2i``, ``2i + 1``)
    from the first, an odd last key paired with zeros: the sums do not depend on where the
    rows lie.  Each 32 columns of a pair of rows are two 64-byte loads and two in-lane
    unpacks, their accumulators held in the unpacks' order (permuted once on load and once
    on store); 16 columns left over are interleaved in natural order.  In-lane unpacks
    are cheaper per key than a cross-lane interleave of 16 columns per vector, over long
    runs of keys and short ones (docs/guide/decode.md).

    Before the pair ``t, t + 1`` it prefetches (into L2) columns ``col0 .. col0 + ncols``
    of rows ``ahead[t]`` and ``ahead[t + 1]`` for ``t < n_ahead`` (the rows taken next:
    one or two cache lines per row and call, spread over the product rather than sent in
    a burst before it): a loop over the pairs that prefetch, then one over those that do
    not, no test per pair.  ``ncols`` a multiple of :data:`LANES`; ``mr``, ``ncols`` and
    ``native`` compile-time constants.  No bounds checks."""
    blocks = _blocks((mr, types.IntegerLiteral), (ncols, types.IntegerLiteral),
                     (native, types.BooleanLiteral))
    if blocks is None or blocks[1] % LANES or not _bits_ok(w, b):
        return None
    if not isinstance(c, types.Array) or c.dtype != types.float32:
        return None
    if not (indices_ok(rows, (w0, ldw, nk, col0, ldb, c0, ldc, n_ahead))
            and indices_ok(ahead, ())):
        return None
    sig = types.void(w, w0, ldw, b, rows, nk, col0, ldb, c, c0, ldc, ahead, n_ahead, mr,
                     ncols, native)
    return sig, functools.partial(_rows_product_codegen, *blocks)


def _smaller(builder, x, y):
    """LLVM IR: the smaller of signed integers ``x`` and ``y``."""
    return builder.select(builder.icmp_signed("<", x, y), x, y)


def _rows_product_codegen(mr, ncols, native, context, builder, signature, args):
    i64, i32, i16 = ir.IntType(64), ir.IntType(32), ir.IntType(16)
    ty = signature.args
    w0_, ldw_, nk_, col0_, ldb_, c0_, ldc_, n_ahead_ = _int64_args(
        context, builder, signature, args, (1, 2, 5, 6, 7, 9, 10, 12))
    pw = _pointer(context, builder, ty[0], args[0], w0_)
    pb = _pointer(context, builder, ty[3], args[3], col0_)
    pc = _pointer(context, builder, ty[8], args[8], c0_)
    f32v = ir.VectorType(ir.FloatType(), LANES)
    i32v = ir.VectorType(i32, LANES)
    half_row, row = ir.VectorType(i16, LANES), ir.VectorType(i16, PAIR_BLOCK)
    groups, tail = ncols // PAIR_BLOCK, ncols % PAIR_BLOCK  # tail: 0 or LANES columns

    def mask(indices):
        return ir.Constant(ir.VectorType(i32, len(indices)), indices)

    def c_vector(r, column):
        at = builder.add(builder.mul(ldc_, ir.Constant(i64, r)), ir.Constant(i64, column))
        return builder.bitcast(builder.gep(pc, [at]), f32v.as_pointer())

    # accumulators, per row: (low, high) of each 32 columns, then the tail's
    accs = []
    for r in range(mr):
        initial = []
        for g in range(groups):
            first, second = (builder.load(c_vector(r, PAIR_BLOCK * g + h * LANES), align=4)
                             for h in (0, 1))
            initial += [builder.shuffle_vector(first, second, mask(_COLUMNS_LOW)),
                        builder.shuffle_vector(first, second, mask(_COLUMNS_HIGH))]
        if tail:
            initial.append(builder.load(c_vector(r, PAIR_BLOCK * groups), align=4))
        accs.append(_accumulators(builder, f32v, len(initial), initial))
    w_rows = [builder.gep(pw, [builder.mul(ldw_, ir.Constant(i64, r))]) for r in range(mr)]

    lines = -(-ncols * 2 // CACHE_LINE)  # of columns col0 .. col0 + ncols of a row

    def prefetch(t):
        row = key_pointers(context, builder, ty[11], args[11], t, ldb_, pb, 1)[0]
        start = builder.bitcast(row, ir.IntType(8).as_pointer())
        for line in range(lines):
            prefetch_line(builder, builder.gep(start, [ir.Constant(i64, line * CACHE_LINE)]))

    def step(t, second_row, weight_of, prefetching=False):
        """Keys ``t`` and ``t + 1`` (``second_row`` False: ``t`` and zeros), prefetching
        rows ``ahead[t]`` and ``ahead[t + 1]`` if ``prefetching``."""
        if prefetching:
            prefetch(t)
            prefetch(builder.add(t, ir.Constant(i64, 1)))
        first, second = (key_pointers(context, builder, ty[4], args[4], t, ldb_, pb,
                                      2 if second_row else 1) + [None])[:2]
        pairs = []
        for g in range(groups):
            col = ir.Constant(i64, g * PAIR_BLOCK)
            v0 = _vector_at(builder, first, col, row)
            v1 = _vector_at(builder, second, col, row) if second_row else ir.Constant(row, None)
            pairs += [builder.bitcast(builder.shuffle_vector(v0, v1, mask(_UNPACK_LOW)), i32v),
                      builder.bitcast(builder.shuffle_vector(v0, v1, mask(_UNPACK_HIGH)), i32v)]
        if tail:
            col = ir.Constant(i64, groups * PAIR_BLOCK)
            v0 = _vector_at(builder, first, col, half_row)
            v1 = (_vector_at(builder, second, col, half_row) if second_row
                  else ir.Constant(half_row, None))
            pairs.append(builder.bitcast(builder.shuffle_vector(v0, v1, mask(_INTERLEAVE)), i32v))
        for r in range(mr):
            wv = builder.insert_element(ir.Constant(i32v, ir.Undefined), weight_of(r, t),
                                        ir.Constant(i32, 0))
            wv = builder.shuffle_vector(wv, ir.Constant(i32v, ir.Undefined),
                                        ir.Constant(i32v, [0] * LANES))
            for acc, pair in zip(accs[r], pairs, strict=True):
                builder.store(dot_pairs(builder, builder.load(acc), wv, pair, native), acc)

    def weight_pair(r, t):  # w[t] (low half) and w[t + 1] (high half), one 32-bit load
        ptr = builder.bitcast(builder.gep(w_rows[r], [t]), i32.as_pointer())
        return builder.load(ptr, align=2)

    def weight_alone(r, t):  # w[t] and a zero
        return builder.zext(builder.load(builder.gep(w_rows[r], [t])), i32)

    # pairs whose both rows ahead are to be prefetched, then the rest (no test per pair);
    # an odd count of rows ahead leaves one, prefetched between the two loops
    one, two = ir.Constant(i64, 1), ir.Constant(i64, 2)
    n_pf = _smaller(builder, nk_, builder.select(
        builder.icmp_signed("<", n_ahead_, ir.Constant(i64, 0)), ir.Constant(i64, 0), n_ahead_))
    pf_pairs = builder.udiv(n_pf, two)
    with cgutils.for_range(builder, pf_pairs) as loop:
        step(builder.mul(loop.index, two), True, weight_pair, prefetching=True)
    with builder.if_then(builder.icmp_unsigned("==", builder.and_(n_pf, one), one)):
        prefetch(builder.sub(n_pf, one))
    with cgutils.for_range_slice(builder, pf_pairs, builder.udiv(nk_, two), one,
                                 intp=i64) as (pair, _):
        step(builder.mul(pair, two), True, weight_pair)
    with builder.if_then(builder.icmp_unsigned("==", builder.and_(nk_, one), one)):
        step(builder.sub(nk_, one), False, weight_alone)
    for r in range(mr):
        values = [builder.load(acc) for acc in accs[r]]
        for g in range(groups):
            low, high = values[2 * g], values[2 * g + 1]
            for h in (0, 1):
                natural = builder.shuffle_vector(
                    low, high, mask(_NATURAL[h * LANES:(h + 1) * LANES]))
                builder.store(natural, c_vector(r, PAIR_BLOCK * g + h * LANES), align=4)
        if tail:
            builder.store(values[-1], c_vector(r, PAIR_BLOCK * groups), align=4)
    return context.get_dummy_value()
