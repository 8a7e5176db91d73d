"""LLVM-level helpers for the compiled (numba) ingest loops: raw loads, atomic loads and
stores, and calls of C functions by address.

Word reads go through addresses, not arrays: numba checks a signed array index for
wraparound, and a helper taking arrays costs a call passing each as seven arguments or,
inlined by numba, atomic reference counts on every call. Helpers taking only integers are
inlined with nothing left of them but the loads; a loop takes its arrays' addresses once.

C functions are called through an address passed in as an integer, not as a ctypes function
object: numba bakes a ctypes object's address into the machine code, and then will not cache
the compiled function (every process would compile it afresh, for seconds, on first use).
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable
from typing import Any, cast

import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

_I64 = ir.IntType(64)
_I32 = ir.IntType(32)
_POINTER = ir.IntType(8).as_pointer()


def _address_intrinsic(typingctx: Any, array: Any) -> Any:
    """The address of a contiguous array's first element, as an int64."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        return builder.ptrtoint(data, _I64)

    return types.int64(array), codegen


def _load_codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
    pointer = builder.inttoptr(args[0], _I64.as_pointer())
    return builder.load(pointer, align=1)


def _load_intrinsic(typingctx: Any, address: Any) -> Any:
    """The 8 bytes at ``address`` (any alignment) as a uint64, the first byte in the low bits
    on any host. Nothing is checked: the caller knows the 8 bytes are its array's."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        word = _load_codegen(context, builder, signature, args)
        return word if sys.byteorder == "little" else builder.bswap(word)

    return types.uint64(types.int64), codegen


def _load_int_intrinsic(typingctx: Any, address: Any) -> Any:
    """The int64 at ``address`` (an int64 array's element: native byte order)."""
    return types.int64(types.int64), _load_codegen


def _load_int32_intrinsic(typingctx: Any, address: Any) -> Any:
    """The C ``int`` at ``address`` (native byte order), widened to an int64."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        value = builder.load(builder.inttoptr(args[0], _I32.as_pointer()), align=4)
        return builder.sext(value, _I64)

    return types.int64(types.int64), codegen


def _trailing_zeros_intrinsic(typingctx: Any, word: Any) -> Any:
    """The zero bits below the lowest set bit of a nonzero uint64 (one ``tzcnt``)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.cttz(args[0], ir.Constant(ir.IntType(1), 1))

    return types.int64(types.uint64), codegen


def _as_int_intrinsic(typingctx: Any, word: Any) -> Any:
    """A uint64 as the int64 of the same bits (numba makes a float of uint64 + int64)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return args[0]

    return types.int64(types.uint64), codegen


def _load_acquire_intrinsic(typingctx: Any, address: Any) -> Any:
    """The int64 at ``address`` (8-aligned), an atomic load with acquire ordering: what the
    other thread wrote before its release store of this word is visible after it."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        pointer = builder.inttoptr(args[0], _I64.as_pointer())
        return builder.load_atomic(pointer, "acquire", 8)

    return types.int64(types.int64), codegen


def _store_release_intrinsic(typingctx: Any, address: Any, value: Any) -> Any:
    """Store the int64 ``value`` at ``address`` (8-aligned), atomically with release
    ordering: everything written before it is visible to an acquire load that sees it."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        pointer = builder.inttoptr(args[0], _I64.as_pointer())
        builder.store_atomic(args[1], pointer, "release", 8)
        return context.get_dummy_value()

    return types.none(types.int64, types.int64), codegen


def _c_call(result: ir.Type, *parameters: ir.Type) -> Any:
    """An intrinsic ``call(function_address, *arguments) -> int64`` for a C function of this
    signature: each int64 argument becomes the parameter's C type (a pointer, or a narrower
    int); an int result is sign-extended, a pointer result returned as its address."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        function_type = ir.FunctionType(result, list(parameters))
        function = builder.inttoptr(args[0], function_type.as_pointer())
        converted = []
        for value, parameter in zip(args[1:], parameters, strict=True):
            if isinstance(parameter, ir.PointerType):
                converted.append(builder.inttoptr(value, parameter))
            elif parameter.width < 64:
                converted.append(builder.trunc(value, parameter))
            else:
                converted.append(value)
        returned = builder.call(function, converted)
        if isinstance(result, ir.PointerType):
            return builder.ptrtoint(returned, _I64)
        return builder.sext(returned, _I64) if result.width < 64 else returned

    return intrinsic(_typer(len(parameters), codegen))


def _typer(arity: int, codegen: Any) -> Any:
    """The typing function of a C call with ``arity`` arguments after the function's address
    (numba reads the intrinsic's arity from this function's own parameters; all int64)."""
    signature = types.int64(*[types.int64] * (arity + 1))

    def typer0(typingctx: Any, function: Any) -> Any:
        return signature, codegen

    def typer2(typingctx: Any, function: Any, a: Any, b: Any) -> Any:
        return signature, codegen

    def typer3(typingctx: Any, function: Any, a: Any, b: Any, c: Any) -> Any:
        return signature, codegen

    def typer5(typingctx: Any, function: Any, a: Any, b: Any, c: Any, d: Any, e: Any) -> Any:
        return signature, codegen

    typers = {0: typer0, 2: typer2, 3: typer3, 5: typer5}
    if arity not in typers:
        raise ValueError(f"no C call intrinsic of {arity} arguments")
    return typers[arity]


def c_address(function: Any) -> int:
    """The address of a ctypes function, for the ``call_*`` intrinsics."""
    address = ctypes.cast(function, ctypes.c_void_p).value
    if address is None:
        raise OSError(f"{function!r} has no address")
    return address


address_of = cast(Callable[[np.ndarray], int], intrinsic(_address_intrinsic))
load_u64 = cast(Callable[[int], np.uint64], intrinsic(_load_intrinsic))
load_i64 = cast(Callable[[int], int], intrinsic(_load_int_intrinsic))
load_i32 = cast(Callable[[int], int], intrinsic(_load_int32_intrinsic))
trailing_zeros = cast(Callable[[np.uint64], int], intrinsic(_trailing_zeros_intrinsic))
as_int64 = cast(Callable[[np.uint64], int], intrinsic(_as_int_intrinsic))
load_acquire = cast(Callable[[int], int], intrinsic(_load_acquire_intrinsic))
store_release = cast(Callable[[int, int], None], intrinsic(_store_release_intrinsic))
#: ``recvmmsg(fd, msgvec, vlen, flags, timeout=NULL)``: the timeout is always NULL here
call_recvmmsg = cast(Callable[[int, int, int, int, int, int], int],
                     _c_call(_I32, _I32, _POINTER, _I32, _I32, _POINTER))  # fmt: skip
#: ``poll(fds, nfds, timeout_ms)``
call_poll = cast(Callable[[int, int, int, int], int], _c_call(_I32, _POINTER, _I64, _I32))
#: ``nanosleep(request, remaining)``
call_nanosleep = cast(Callable[[int, int, int], int], _c_call(_I32, _POINTER, _POINTER))
#: ``write(fd, buffer, count)``
call_write = cast(Callable[[int, int, int, int], int], _c_call(_I64, _I32, _POINTER, _I64))
#: ``__errno_location()``: the address of this thread's errno
call_address = cast(Callable[[int], int], _c_call(_POINTER))
