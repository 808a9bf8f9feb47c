"""DLPack export of fixed-size fields (legacy, unversioned `DLManagedTensor`).

The capsule is named "dltensor" and holds a `DLManagedTensor` allocated here.
Its `manager_ctx` is a key into `_LIVE`, which holds the struct, its shape and
strides arrays and the batch's lease: the batch's memory stays alive until
the consumer (numpy, torch) calls the deleter, when its array or tensor is
gone. A capsule never consumed is cleaned up by its destructor, which calls
the same deleter. DLPack has no read-only flag in this version: the tensor
must not be written.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
from typing import Any

KDL_CPU = 1
KDL_UINT = 1


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", _Deleter),
]

_NAME = b"dltensor"
# key -> (the DLManagedTensor, its shape and strides arrays, the lease)
_LIVE: dict[int, tuple[Any, ...]] = {}
_LIVE_LOCK = threading.Lock()
_KEYS = itertools.count(1)


def live_exports():
    """How many exported tensors still hold a batch (for tests)."""
    return len(_LIVE)


@_Deleter
def _deleter(managed):
    key = managed.contents.manager_ctx
    with _LIVE_LOCK:
        _LIVE.pop(key, None)  # drops the lease: the batch may be released now


_PyCapsule_Destructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _PyCapsule_Destructor]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]


@_PyCapsule_Destructor
def _capsule_destructor(capsule):
    # A consumer renames the capsule "used_dltensor" and owns the tensor; an
    # unconsumed one still named "dltensor" is ours to delete.
    if _api.PyCapsule_IsValid(capsule, _NAME):
        ptr = _api.PyCapsule_GetPointer(capsule, _NAME)
        _deleter(ctypes.cast(ptr, ctypes.POINTER(DLManagedTensor)))


def capsule(lease, address, shape, strides):
    """A "dltensor" capsule over uint8 data at `address` (strides in bytes)."""
    ndim = len(shape)
    shape_arr = (ctypes.c_int64 * ndim)(*shape)
    strides_arr = (ctypes.c_int64 * ndim)(*strides)
    m = DLManagedTensor()
    m.dl_tensor.data = address
    m.dl_tensor.device = DLDevice(KDL_CPU, 0)
    m.dl_tensor.ndim = ndim
    m.dl_tensor.dtype = DLDataType(KDL_UINT, 8, 1)
    m.dl_tensor.shape = shape_arr
    m.dl_tensor.strides = strides_arr
    m.dl_tensor.byte_offset = 0
    key = next(_KEYS)
    m.manager_ctx = key
    m.deleter = _deleter
    with _LIVE_LOCK:
        _LIVE[key] = (m, shape_arr, strides_arr, lease)
    return _api.PyCapsule_New(ctypes.addressof(m), _NAME, _capsule_destructor)
