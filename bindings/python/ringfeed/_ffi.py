"""The C ABI of include/ringfeed.h, declared once, in C spelling.

Every struct field, prototype and #define below is written as the header
writes it; the ctypes types are derived from that spelling through
`C_TYPES`. `tests/test_header_drift.py` parses the header and fails when
these declarations and the header disagree.

Loader handles are opaque `void *` values; batch descriptors are read with
numpy in `_batch.py`, so `ringfeed_sample` and `ringfeed_field` are declared
here for the drift check and for their sizes.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

from ._lib import load_library

# #define constants of the header, name -> value.
CONSTANTS = {
    "RINGFEED_VERSION_MAJOR": 0,
    "RINGFEED_VERSION_MINOR": 2,
    "RINGFEED_VERSION_PATCH": 0,
    "RINGFEED_OK": 0,
    "RINGFEED_END_OF_EPOCH": 1,
    "RINGFEED_TIMEOUT": 2,
    "RINGFEED_FINISHED": 3,
    "RINGFEED_ERR_INVALID_ARGUMENT": -1,
    "RINGFEED_ERR_INVALID_HANDLE": -2,
    "RINGFEED_ERR_CONFIG": -3,
    "RINGFEED_ERR_DATASET": -4,
    "RINGFEED_ERR_IO": -5,
    "RINGFEED_ERR_FORMAT": -6,
    "RINGFEED_ERR_MEMORY": -7,
    "RINGFEED_ERR_BUFFER_TOO_SMALL": -8,
    "RINGFEED_ERR_CLOSED": -9,
    "RINGFEED_ERR_PANIC": -10,
    "RINGFEED_ERR_IO_URING": -11,
    "RINGFEED_ERR_NETWORK": -12,
    "RINGFEED_ERR_STATE": -13,
    "RINGFEED_ERR_NODE": -14,
    "RINGFEED_ERR_EXISTS": -15,
    "RINGFEED_MEMORY_HUGETLB": 1,
    "RINGFEED_MEMORY_THP": 2,
    "RINGFEED_MEMORY_NORMAL": 3,
    "RINGFEED_BACKEND_IO_URING": 1,
    "RINGFEED_BACKEND_THREADS": 2,
    "RINGFEED_ABI_VERSION": 1,
    "RINGFEED_LOG_ERROR": 1,
    "RINGFEED_LOG_WARN": 2,
    "RINGFEED_LOG_INFO": 3,
    "RINGFEED_LOG_DEBUG": 4,
}
globals().update(CONSTANTS)
if TYPE_CHECKING:
    # What the line above defines, spelled out for type checkers, which do
    # not run it.
    RINGFEED_VERSION_MAJOR: int
    RINGFEED_VERSION_MINOR: int
    RINGFEED_VERSION_PATCH: int
    RINGFEED_OK: int
    RINGFEED_END_OF_EPOCH: int
    RINGFEED_TIMEOUT: int
    RINGFEED_FINISHED: int
    RINGFEED_ERR_INVALID_ARGUMENT: int
    RINGFEED_ERR_INVALID_HANDLE: int
    RINGFEED_ERR_CONFIG: int
    RINGFEED_ERR_DATASET: int
    RINGFEED_ERR_IO: int
    RINGFEED_ERR_FORMAT: int
    RINGFEED_ERR_MEMORY: int
    RINGFEED_ERR_BUFFER_TOO_SMALL: int
    RINGFEED_ERR_CLOSED: int
    RINGFEED_ERR_PANIC: int
    RINGFEED_ERR_IO_URING: int
    RINGFEED_ERR_NETWORK: int
    RINGFEED_ERR_STATE: int
    RINGFEED_ERR_NODE: int
    RINGFEED_ERR_EXISTS: int
    RINGFEED_MEMORY_HUGETLB: int
    RINGFEED_MEMORY_THP: int
    RINGFEED_MEMORY_NORMAL: int
    RINGFEED_BACKEND_IO_URING: int
    RINGFEED_BACKEND_THREADS: int
    RINGFEED_ABI_VERSION: int
    RINGFEED_LOG_ERROR: int
    RINGFEED_LOG_WARN: int
    RINGFEED_LOG_INFO: int
    RINGFEED_LOG_DEBUG: int

# struct name -> [(C type, field name)], in header order.
STRUCTS = {
    "ringfeed_field": [
        ("const char *", "name"),
        ("const uint8_t *", "data"),
        ("size_t", "len"),
    ],
    "ringfeed_sample": [
        ("const char *", "key"),
        ("const struct ringfeed_field *", "fields"),
        ("size_t", "field_count"),
    ],
    "ringfeed_batch": [
        ("uint64_t", "handle"),
        ("uint64_t", "epoch"),
        ("uint64_t", "index"),
        ("uint64_t", "bytes"),
        ("size_t", "sample_count"),
        ("const struct ringfeed_sample *", "samples"),
        ("size_t", "field_count"),
        ("const struct ringfeed_field *", "fields"),
    ],
    "ringfeed_image_info": [
        ("uint64_t", "out_bytes"),
        ("uint32_t", "dim0"),
        ("uint32_t", "dim1"),
        ("uint32_t", "dim2"),
        ("uint32_t", "elem_bytes"),
        ("uint32_t", "source_width"),
        ("uint32_t", "source_height"),
        ("double", "crop_top"),
        ("double", "crop_left"),
        ("double", "crop_height"),
        ("double", "crop_width"),
        ("uint32_t", "flipped"),
        ("double", "decode_scale"),
    ],
    "ringfeed_stats": [
        ("uint64_t", "size"),
        ("uint64_t", "bytes_delivered"),
        ("uint64_t", "samples_delivered"),
        ("uint64_t", "batches_delivered"),
        ("uint64_t", "bytes_read"),
        ("uint64_t", "bytes_copied"),
        ("uint64_t", "reads"),
        ("uint64_t", "members"),
        ("uint64_t", "members_skipped"),
        ("uint64_t", "entries_skipped"),
        ("uint64_t", "samples_dropped"),
        ("uint64_t", "shards_total"),
        ("uint64_t", "shards_done"),
        ("uint64_t", "epochs_done"),
        ("uint64_t", "chunk_size"),
        ("uint64_t", "chunk_count"),
        ("uint64_t", "chunks_in_use"),
        ("uint64_t", "chunks_peak"),
        ("uint64_t", "arena_bytes"),
        ("uint64_t", "consumer_wait_ns"),
        ("uint64_t", "time_to_first_batch_ns"),
        ("uint64_t", "elapsed_ns"),
        ("uint64_t", "http_requests"),
        ("uint64_t", "retries"),
        ("uint64_t", "samples_padded"),
        ("uint64_t", "batches_skipped"),
        ("uint64_t", "samples_skipped"),
        ("uint64_t", "shuffle_copied"),
        ("uint64_t", "epoch"),
        ("uint64_t", "consumers"),
        ("uint64_t", "consumer"),
        ("uint32_t", "workers"),
        ("int32_t", "memory_kind"),
        ("int32_t", "io_backend"),
        ("uint32_t", "memory_locked"),
        ("uint32_t", "buffers_registered"),
        ("uint64_t", "cache_hits"),
        ("uint64_t", "cache_misses"),
        ("uint64_t", "cache_bytes"),
        ("uint64_t", "cache_written"),
        ("uint64_t", "cache_bytes_written"),
        ("uint64_t", "cache_evictions"),
        ("uint64_t", "cache_corrupt"),
        ("uint64_t", "cache_stale"),
        ("uint64_t", "cache_uncached"),
        ("uint64_t", "net_reads_in_flight"),
        ("uint64_t", "net_read_time_us"),
        ("uint64_t", "net_bdp_bytes"),
        ("uint64_t", "reads_ahead"),
        ("uint64_t", "hedges_sent"),
        ("uint64_t", "hedges_won"),
        ("uint64_t", "net_first_byte_us"),
        ("uint64_t", "images_skipped"),
    ],
}

# function name -> (C return type, [(C type, parameter name)]).
FUNCTIONS = {
    "ringfeed_loader_open": (
        "int32_t",
        [("const char *", "config_json"), ("struct ringfeed_loader **", "out")],
    ),
    "ringfeed_loader_next": (
        "int32_t",
        [
            ("struct ringfeed_loader *", "loader"),
            ("int64_t", "timeout_ms"),
            ("struct ringfeed_batch *", "out"),
        ],
    ),
    "ringfeed_batch_release": ("int32_t", [("struct ringfeed_batch *", "batch")]),
    "ringfeed_loader_stats": (
        "int32_t",
        [("struct ringfeed_loader *", "loader"), ("struct ringfeed_stats *", "out")],
    ),
    "ringfeed_loader_metrics": (
        "int32_t",
        [
            ("struct ringfeed_loader *", "loader"),
            ("char *", "buf"),
            ("size_t", "len"),
            ("size_t *", "needed"),
        ],
    ),
    "ringfeed_set_log_callback": (
        "int32_t",
        [("ringfeed_log_callback", "callback"), ("void *", "user"), ("int32_t", "max_level")],
    ),
    "ringfeed_loader_stats_json": (
        "int32_t",
        [
            ("struct ringfeed_loader *", "loader"),
            ("char *", "buf"),
            ("size_t", "len"),
            ("size_t *", "needed"),
        ],
    ),
    "ringfeed_plan_json": (
        "int32_t",
        [
            ("const char *", "config_json"),
            ("char *", "buf"),
            ("size_t", "len"),
            ("size_t *", "needed"),
        ],
    ),
    "ringfeed_loader_state": (
        "int32_t",
        [
            ("struct ringfeed_loader *", "loader"),
            ("char *", "buf"),
            ("size_t", "len"),
            ("size_t *", "needed"),
        ],
    ),
    "ringfeed_batch_sample_source": (
        "int32_t",
        [
            ("const struct ringfeed_batch *", "batch"),
            ("size_t", "sample"),
            ("char *", "buf"),
            ("size_t", "len"),
            ("size_t *", "needed"),
        ],
    ),
    "ringfeed_batch_node_key": (
        "int32_t",
        [
            ("const struct ringfeed_batch *", "batch"),
            ("char *", "buf"),
            ("size_t", "len"),
            ("size_t *", "needed"),
        ],
    ),
    "ringfeed_batch_ship": (
        "int32_t",
        [
            ("const struct ringfeed_batch *", "batch"),
            ("char *", "buf"),
            ("size_t", "len"),
            ("size_t *", "needed"),
        ],
    ),
    "ringfeed_node_claim": (
        "int32_t",
        [("const char *", "key"), ("const uint8_t **", "base"), ("uint64_t *", "len")],
    ),
    "ringfeed_node_keep": ("int32_t", [("const char *", "key"), ("int32_t", "pid")]),
    "ringfeed_node_release": ("int32_t", [("const char *", "key")]),
    "ringfeed_loader_arena": (
        "int32_t",
        [
            ("struct ringfeed_loader *", "loader"),
            ("int32_t *", "fd"),
            ("const uint8_t **", "base"),
            ("uint64_t *", "len"),
        ],
    ),
    "ringfeed_gather": (
        "int32_t",
        [
            ("const uint8_t *", "src"),
            ("size_t", "src_len"),
            ("const int64_t *", "starts"),
            ("const int64_t *", "lengths"),
            ("size_t", "count"),
            ("uint8_t *", "dst"),
            ("size_t", "dst_len"),
        ],
    ),
    "ringfeed_loader_close": ("int32_t", [("struct ringfeed_loader *", "loader")]),
    "ringfeed_object_read": (
        "int32_t",
        [
            ("const char *", "url"),
            ("const char *", "config_json"),
            ("struct ringfeed_object **", "out"),
        ],
    ),
    "ringfeed_object_data": (
        "int32_t",
        [
            ("const struct ringfeed_object *", "object"),
            ("const uint8_t **", "data"),
            ("uint64_t *", "len"),
        ],
    ),
    "ringfeed_object_release": ("int32_t", [("struct ringfeed_object *", "object")]),
    "ringfeed_object_read_into": (
        "int32_t",
        [
            ("const char *", "url"),
            ("const char *", "config_json"),
            ("uint8_t *", "buf"),
            ("uint64_t", "len"),
            ("uint64_t *", "size"),
        ],
    ),
    "ringfeed_object_list": (
        "int32_t",
        [
            ("const char *", "url"),
            ("const char *", "config_json"),
            ("char *", "buf"),
            ("size_t", "len"),
            ("size_t *", "needed"),
        ],
    ),
    "ringfeed_object_exists": (
        "int32_t",
        [
            ("const char *", "url"),
            ("const char *", "config_json"),
            ("int32_t *", "exists"),
        ],
    ),
    "ringfeed_object_write": (
        "int32_t",
        [
            ("const char *", "url"),
            ("const char *", "config_json"),
            ("const uint8_t *", "data"),
            ("uint64_t", "len"),
        ],
    ),
    "ringfeed_writer_open": (
        "int32_t",
        [
            ("const char *", "url"),
            ("const char *", "config_json"),
            ("struct ringfeed_writer **", "out"),
        ],
    ),
    "ringfeed_writer_write": (
        "int32_t",
        [
            ("struct ringfeed_writer *", "writer"),
            ("const uint8_t *", "data"),
            ("uint64_t", "len"),
        ],
    ),
    "ringfeed_writer_finish": ("int32_t", [("struct ringfeed_writer *", "writer")]),
    "ringfeed_writer_abort": ("int32_t", [("struct ringfeed_writer *", "writer")]),
    "ringfeed_last_error": ("size_t", [("char *", "buf"), ("size_t", "len")]),
    "ringfeed_redact": ("size_t", [("const char *", "text"), ("char *", "buf"), ("size_t", "len")]),
    "ringfeed_status_name": ("const char *", [("int32_t", "status")]),
    "ringfeed_version": ("const char *", []),
    "ringfeed_abi_version": ("uint32_t", []),
    "ringfeed_image_transform": (
        "int32_t",
        [
            ("const char *", "spec_json"),
            ("const char *", "field"),
            ("const uint8_t *", "data"),
            ("uint64_t", "len"),
            ("uint64_t", "seed"),
            ("uint64_t", "epoch"),
            ("uint64_t", "position"),
            ("uint8_t *", "out"),
            ("uint64_t", "out_len"),
            ("struct ringfeed_image_info *", "info"),
        ],
    ),
    "ringfeed_config_keys": ("const char *", []),
}


def _struct(name):
    return STRUCT_TYPES[name]


# C spelling -> ctypes type. Pointers to library-owned arrays are plain
# addresses (c_void_p): Python reads them with numpy, never through ctypes
# pointer objects.
# The log callback's type (ringfeed_log_callback).
LOG_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int32, ctypes.c_char_p)

C_TYPES = {
    "ringfeed_log_callback": LOG_CALLBACK,
    "void *": ctypes.c_void_p,
    "int32_t": ctypes.c_int32,
    "uint32_t": ctypes.c_uint32,
    "int64_t": ctypes.c_int64,
    "uint64_t": ctypes.c_uint64,
    "double": ctypes.c_double,
    "size_t": ctypes.c_size_t,
    "size_t *": ctypes.POINTER(ctypes.c_size_t),
    "const char *": ctypes.c_char_p,
    "char *": ctypes.c_char_p,
    "const uint8_t *": ctypes.c_void_p,
    "const struct ringfeed_field *": ctypes.c_void_p,
    "const struct ringfeed_sample *": ctypes.c_void_p,
    "struct ringfeed_loader *": ctypes.c_void_p,
    "struct ringfeed_loader **": ctypes.POINTER(ctypes.c_void_p),
    "struct ringfeed_object *": ctypes.c_void_p,
    "const struct ringfeed_object *": ctypes.c_void_p,
    "struct ringfeed_object **": ctypes.POINTER(ctypes.c_void_p),
    "struct ringfeed_writer *": ctypes.c_void_p,
    "struct ringfeed_writer **": ctypes.POINTER(ctypes.c_void_p),
    "struct ringfeed_batch *": None,  # filled below: POINTER(ringfeed_batch)
    "const struct ringfeed_batch *": None,  # the same
    "int32_t *": ctypes.POINTER(ctypes.c_int32),
    "uint64_t *": ctypes.POINTER(ctypes.c_uint64),
    "const uint8_t **": ctypes.POINTER(ctypes.c_void_p),
    # Arrays the caller owns (numpy buffers): passed as addresses.
    "const int64_t *": ctypes.c_void_p,
    "uint8_t *": ctypes.c_void_p,
    "struct ringfeed_stats *": None,  # filled below: POINTER(ringfeed_stats)
    "struct ringfeed_image_info *": None,  # filled below
}

STRUCT_TYPES: dict[str, type[ctypes.Structure]] = {}
for _name, _fields in STRUCTS.items():
    STRUCT_TYPES[_name] = type(
        _name, (ctypes.Structure,), {"_fields_": [(f, C_TYPES[t]) for t, f in _fields]}
    )
C_TYPES["struct ringfeed_batch *"] = ctypes.POINTER(STRUCT_TYPES["ringfeed_batch"])
C_TYPES["const struct ringfeed_batch *"] = C_TYPES["struct ringfeed_batch *"]
C_TYPES["struct ringfeed_stats *"] = ctypes.POINTER(STRUCT_TYPES["ringfeed_stats"])
C_TYPES["struct ringfeed_image_info *"] = ctypes.POINTER(STRUCT_TYPES["ringfeed_image_info"])

RawBatch = STRUCT_TYPES["ringfeed_batch"]
RawStats = STRUCT_TYPES["ringfeed_stats"]
RawField = STRUCT_TYPES["ringfeed_field"]
RawSample = STRUCT_TYPES["ringfeed_sample"]

lib, LIBRARY_PATH = load_library()
for _fname, (_ret, _params) in FUNCTIONS.items():
    _f = getattr(lib, _fname)
    _f.restype = C_TYPES[_ret]
    _f.argtypes = [C_TYPES[t] for t, _ in _params]
