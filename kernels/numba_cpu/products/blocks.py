"""Dot products of a block of rows with a block of key rows: the decode kernel's scores.

:func:`kernels.numba_cpu.products.intrinsics.row_dots` takes one key row at a time for ``mr`` query
rows and ends each (row, key) dot with its own pairwise fold of ``nr`` lanes.
:func:`block_dots` takes ``nk`` key rows at once (``mr·nk`` a power of two ``<= nr``: four
keys for four rows at sixteen lanes), so each query vector and key vector is loaded once
per step for the whole block, and folds the ``mr·nk`` accumulators together
(:func:`lanes_transposed`): the same additions in the same order as ``row_dots``' folds,
bit for bit, in far fewer shuffles and adds, and one vector store of ``nk`` scores per
row.  Key rows are given by index (``rows[j0 + k]``: the rows of a paged cache in the order
the block table lists them).  The bfloat16 pair version,
:func:`kernels.numba_cpu.products.pairs.pair_block_dots`, shares the fold and the
addressing.  No bounds checks: the caller guarantees every index is inside its array.
"""

from __future__ import annotations

import functools

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .intrinsics import (
    _accumulators,
    _fmuladd,
    _int64_args,
    _literal,
    _operands_ok,
    _pointer,
    _vector_loader,
)

__all__ = ["block_dots", "block_dots_ir", "indices_ok", "key_pointers", "lanes_transposed"]


def lanes_transposed(builder, vectors, nr):
    """The lanes of each of ``vectors`` (``n`` vectors of ``nr`` lanes, ``n`` a power of
    two ``<= nr``) added pairwise as ``row_dots`` adds them (``products._lanes_added``),
    vector i's sum in lane i of the result (``<n x elem>``): bit for bit the same sums, in
    ``2(n - 1)`` shuffles and ``n - 1`` adds while vectors are paired, then
    ``2·log2(nr / n)`` shuffles and adds, where ``row_dots`` takes ``2·log2(nr)`` per
    vector.

    Vectors are added in pairs (x, y): x's sums of width ``w`` become sums of width ``w/2``
    in the low half of the result (lane i of a sum plus lane ``i + w/2``: halves, as
    ``products._lanes_folded`` adds them), y's in the high half; the last vector's sums are
    then folded in place."""
    i32 = ir.IntType(32)
    count, width = len(vectors), nr
    if count & (count - 1) or count > nr:
        raise ValueError(f"{count} vectors of {nr} lanes cannot be transposed")

    def halves(dots, width, offset=0):
        half = width // 2
        low = [offset + s * width + i for s in range(dots) for i in range(half)]
        return low, [x + half for x in low]

    while len(vectors) > 1:
        low, high = halves(nr // width, width)
        low_mask = ir.Constant(ir.VectorType(i32, nr), low + [nr + x for x in low])
        high_mask = ir.Constant(ir.VectorType(i32, nr), high + [nr + x for x in high])
        vectors = [builder.fadd(builder.shuffle_vector(x, y, low_mask),
                                builder.shuffle_vector(x, y, high_mask))
                   for x, y in zip(vectors[::2], vectors[1::2], strict=True)]
        width //= 2
    total = vectors[0]
    while width > 1:
        low, high = halves(count, width)
        total = builder.fadd(
            builder.shuffle_vector(total, total, ir.Constant(ir.VectorType(i32, len(low)), low)),
            builder.shuffle_vector(total, total, ir.Constant(ir.VectorType(i32, len(high)), high)))
        width //= 2
    return total


def block_dots_ir(builder, accs, mr, nk, nr, pc, ldc, elem, align):
    """Store the sums of the ``mr·nk`` accumulators ``accs`` (row-major: row r, key k at
    ``r·nk + k``), each folded as ``row_dots`` folds its lanes, to ``pc[r·ldc + k]``: one
    vector store of ``nk`` sums per row."""
    i32, i64 = ir.IntType(32), ir.IntType(64)
    sums = lanes_transposed(builder, [builder.load(acc) for acc in accs], nr)
    row_vec = ir.VectorType(elem, nk)
    for r in range(mr):
        target = builder.gep(pc, [builder.mul(ldc, ir.Constant(i64, r))])
        if nk == 1:
            builder.store(builder.extract_element(sums, ir.Constant(i32, r)), target)
            continue
        row = builder.shuffle_vector(sums, sums, ir.Constant(
            ir.VectorType(i32, nk), list(range(r * nk, (r + 1) * nk))))
        builder.store(row, builder.bitcast(target, row_vec.as_pointer()), align=align)


def key_pointers(context, builder, rows_type, rows, j0, ldb, pb, nk):
    """Pointers to key rows ``rows[j0 + k]`` (``k < nk``) of B (``pb``, rows of ``ldb``
    elements)."""
    pointers = []
    for k in range(nk):
        at = builder.add(j0, ir.Constant(ir.IntType(64), k))
        row = context.cast(builder, builder.load(_pointer(context, builder, rows_type, rows, at)),
                           rows_type.dtype, types.int64)
        pointers.append(builder.gep(pb, [builder.mul(row, ldb)]))
    return pointers


def indices_ok(rows, offsets) -> bool:
    """Whether ``rows`` is an integer array and every one of ``offsets`` an integer (the
    typing of :func:`block_dots` and its bfloat16 pair version)."""
    return (isinstance(rows, types.Array) and isinstance(rows.dtype, types.Integer)
            and all(isinstance(n, types.Integer) for n in offsets))


def _block_literals(mr, nk, nr):
    """``(mr, nk, nr)`` as ints where they are literals with ``mr·nk`` a power of two
    ``<= nr`` (also a power of two); else None."""
    blocks = [_literal(x, types.IntegerLiteral) for x in (mr, nk, nr)]
    if None in blocks:
        return None
    mr_, nk_, nr_ = blocks
    count = mr_ * nk_
    if nr_ & (nr_ - 1) or count < 1 or count & (count - 1) or count > nr_:
        return None
    return blocks


@intrinsic
def block_dots(typingctx, a, a0, lda, b, rows, j0, ldb, c, c0, ldc, depth, mr, nk, nr):
    """``block_dots(a, a0, lda, b, rows, j0, ldb, c, c0, ldc, depth, mr, nk, nr)``.

    Sets ``c[c0 + r·ldc + k]`` to the sum over ``t < depth`` of ``a[a0 + r·lda + t] ·
    b[rows[j0 + k]·ldb + t]`` for ``r < mr``, ``k < nk``: :func:`row_dots` for ``nk`` key
    rows at once (given by index: the rows of a paged cache), the same sums bit for bit.
    Each step loads ``mr`` vectors of A and ``nk`` of B for ``mr·nk`` fused multiply-adds
    (:func:`row_dots`: ``mr + 1`` for ``mr``), and the sums are folded together
    (:func:`lanes_transposed`).  ``mr``, ``nk``, ``nr`` compile-time constants, ``mr·nk``
    a power of two ``<= nr``; ``depth`` a multiple of ``nr``."""
    blocks = _block_literals(mr, nk, nr)
    if blocks is None or not _operands_ok(a, b, c) or not indices_ok(
            rows, (a0, lda, j0, ldb, c0, ldc, depth)):
        return None
    sig = types.void(a, a0, lda, b, rows, j0, ldb, c, c0, ldc, depth, mr, nk, nr)
    return sig, functools.partial(_block_dots_codegen, *blocks)


def _block_dots_codegen(mr, nk, nr, context, builder, signature, args):
    """LLVM IR of :func:`block_dots`."""
    i64 = ir.IntType(64)
    ty = signature.args
    a0_, lda_, j0_, ldb_, c0_, ldc_, depth_ = _int64_args(context, builder, signature, args,
                                                          (1, 2, 5, 6, 8, 9, 10))
    elem = context.get_value_type(ty[0].dtype)
    align = context.get_abi_sizeof(elem)
    vec = ir.VectorType(elem, nr)
    pa = _pointer(context, builder, ty[0], args[0], a0_)
    pb = _pointer(context, builder, ty[3], args[3], ir.Constant(i64, 0))
    pc = _pointer(context, builder, ty[7], args[7], c0_)
    load_b = _vector_loader(context, builder, ty[3], nr, align)
    fmuladd = _fmuladd(context, builder, elem, nr, align)
    rows_a = [builder.gep(pa, [builder.mul(lda_, ir.Constant(i64, r))]) for r in range(mr)]
    rows_b = key_pointers(context, builder, ty[4], args[4], j0_, ldb_, pb, nk)
    accs = _accumulators(builder, vec, mr * nk)
    with cgutils.for_range(builder, builder.udiv(depth_, ir.Constant(i64, nr))) as loop:
        t = builder.mul(loop.index, ir.Constant(i64, nr))
        bvs = [load_b(builder.gep(row, [t])) for row in rows_b]
        for r in range(mr):
            av = builder.load(builder.bitcast(builder.gep(rows_a[r], [t]), vec.as_pointer()),
                              align=align)
            for k in range(nk):
                acc = accs[r * nk + k]
                builder.store(builder.call(fmuladd, [av, bvs[k], builder.load(acc)]), acc)
    block_dots_ir(builder, accs, mr, nk, nr, pc, ldc_, elem, align)
    return context.get_dummy_value()
