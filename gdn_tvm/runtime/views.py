"""Row-range views of a device tensor that compiled kernels accept as arguments.

A TVM kernel takes a tensor only at `byte_offset == 0` (its buffers have no element offset), so
`Tensor._create_view(..., relative_byte_offset=k)` cannot feed one. `row_view` instead hands TVM a DLPack tensor
whose data pointer is advanced by the offset, sharing the base allocation: what a PyTorch slice exports. The view
does not own the allocation: the caller keeps the base alive as long as the view (a layer holds both). B = 1 steps
use it to give each consumer its part of a stacked projection.
"""

from __future__ import annotations

import ctypes
import math

import tvm

from gdn_tvm.plan import VIEW_ALIGN
from gdn_tvm.signature import ArgumentError


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _Device),
        ("ndim", ctypes.c_int32),
        ("dtype", _DataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_libc = ctypes.CDLL(None)
_libc.malloc.restype = ctypes.c_void_p
_libc.malloc.argtypes = [ctypes.c_size_t]
_FREE = ctypes.cast(_libc.free, ctypes.c_void_p).value  # the deleter: one malloc holds the struct and its shape

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def row_view(base: tvm.runtime.Tensor, start: int, shape: tuple[int, ...]) -> tvm.runtime.Tensor:
    """The elements `[start, start + prod(shape))` of contiguous `base` (of any scalar dtype), as a tensor of `shape`
    that lives no longer than `base`."""
    count = math.prod(shape)
    dtype = tvm.runtime.DataType(str(base.dtype))
    if dtype.lanes != 1 or dtype.bits % 8 or not base.is_contiguous():
        raise ArgumentError(f"row_view: base must be contiguous of a scalar dtype, got {base.dtype}")
    if not 0 <= start <= start + count <= base.numel():
        raise ArgumentError(f"row_view: elements [{start}, {start + count}) lie outside the base's {base.numel()}")
    offset = dtype.bits // 8 * start
    if (base.data_ptr() + offset) % VIEW_ALIGN:
        raise ArgumentError(f"row_view: element {start} is not {VIEW_ALIGN}-byte aligned")
    block = _libc.malloc(ctypes.sizeof(_Managed) + 8 * len(shape))  # freed by TVM through the deleter
    if not block:
        raise MemoryError("row_view: malloc failed")
    dims = (ctypes.c_int64 * len(shape)).from_address(block + ctypes.sizeof(_Managed))
    dims[:] = list(shape)
    managed = _Managed.from_address(block)
    dev = base.device
    managed.dl_tensor = _DLTensor(
        base.data_ptr() + offset,
        _Device(dev.dlpack_device_type(), dev.index),
        len(shape),
        _DataType(dtype.type_code, dtype.bits, 1),
        ctypes.cast(block + ctypes.sizeof(_Managed), ctypes.POINTER(ctypes.c_int64)),
        None,
        0,
    )
    managed.manager_ctx, managed.deleter = None, _FREE
    return tvm.runtime.from_dlpack(_capsule_new(block, b"dltensor", None))
