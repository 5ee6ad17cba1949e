"""Atomic operations on int64 array cells for the compiled kernels (numba intrinsics).

The kernels' threads (:mod:`fsll_ooc.kernels.threadpool`) coordinate through a few int64
cells: they take work by :func:`fetch_add` or :func:`cas` and count it done, and wait by
:func:`load`.  Each is one sequentially consistent LLVM atomic instruction, so what a thread
wrote before it is seen by a thread that reads its result.
"""
from __future__ import annotations

from numba import types
from numba.core import cgutils
from numba.core.extending import intrinsic

__all__ = ["fetch_add", "cas", "load", "store"]


@intrinsic
def fetch_add(typingctx, arr, idx, val):
    """``old = arr[idx]; arr[idx] += val; return old`` as one atomic (sequentially
    consistent) instruction."""
    sig = types.int64(arr, types.intp, types.int64)

    def codegen(context, builder, signature, args):
        aty = signature.args[0]
        ary = context.make_array(aty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, aty, ary, [args[1]])
        return builder.atomic_rmw("add", ptr, args[2], "seq_cst")

    return sig, codegen


@intrinsic
def cas(typingctx, arr, idx, expected, new):
    """``arr[idx] = new`` if it holds ``expected``, atomically (sequentially consistent); did it?"""
    sig = types.boolean(arr, types.intp, types.int64, types.int64)

    def codegen(context, builder, signature, args):
        aty = signature.args[0]
        ary = context.make_array(aty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, aty, ary, [args[1]])
        res = builder.cmpxchg(ptr, args[2], args[3], "seq_cst", "seq_cst")
        return builder.extract_value(res, 1)

    return sig, codegen


@intrinsic
def load(typingctx, arr, idx):
    """``arr[idx]``, an atomic (sequentially consistent) read."""
    sig = types.int64(arr, types.intp)

    def codegen(context, builder, signature, args):
        aty = signature.args[0]
        ary = context.make_array(aty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, aty, ary, [args[1]])
        return builder.load_atomic(ptr, "seq_cst", 8)

    return sig, codegen


@intrinsic
def store(typingctx, arr, idx, val):
    """``arr[idx] = val``, an atomic (sequentially consistent) write."""
    sig = types.void(arr, types.intp, types.int64)

    def codegen(context, builder, signature, args):
        aty = signature.args[0]
        ary = context.make_array(aty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, aty, ary, [args[1]])
        builder.store_atomic(args[2], ptr, "seq_cst", 8)
        return context.get_dummy_value()

    return sig, codegen
