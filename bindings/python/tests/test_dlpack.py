import gc
import weakref

import numpy as np
import pytest
import ringfeed
from ringfeed import _dlpack

from conftest import require, sample_bytes


def first_batch(urls, **kw):
    loader = ringfeed.Loader(urls, **kw)
    b = next(loader)
    loader.close()
    return b


def test_numpy_from_dlpack_zero_copy_and_lifetime(fixed_shards):
    gc.collect()
    exports = _dlpack.live_exports()
    b = first_batch(fixed_shards, batch_size=16)
    lease = weakref.ref(b._lease)
    v = b["vec"]
    assert v.__dlpack_device__() == (1, 0)
    arr = np.from_dlpack(v)
    assert arr.shape == (16, 1000) and arr.ctypes.data == int(v.addresses[0])
    assert arr.strides == (1536, 1)
    keys = b.keys
    assert b.release() is False
    assert lease() is not None and _dlpack.live_exports() == exports + 1
    assert arr[5].tobytes() == sample_bytes(keys[5], "vec", 1000)
    del arr
    gc.collect()
    assert lease() is None


def test_unconsumed_capsule_releases(fixed_shards):
    b = first_batch(fixed_shards, batch_size=4)
    lease = weakref.ref(b._lease)
    cap = b["vec"].__dlpack__()
    b.release()
    assert lease() is not None
    del cap
    gc.collect()
    assert lease() is None


def test_dlpack_refuses_copy_false_when_not_strided(small_shards):
    with first_batch(small_shards, batch_size=4) as b:
        with pytest.raises(ValueError):
            b["jpg"].__dlpack__()  # not fixed-size


def test_torch_from_dlpack_zero_copy_and_lifetime(fixed_shards):
    torch = require("torch", "torch.from_dlpack on a batch")
    b = first_batch(fixed_shards, batch_size=16)
    lease = weakref.ref(b._lease)
    v = b["vec"]
    t = torch.from_dlpack(v)
    assert t.dtype == torch.uint8 and tuple(t.shape) == (16, 1000)
    assert t.data_ptr() == int(v.addresses[0])
    assert t.stride() == (1536, 1)
    keys = b.keys
    b.release()
    assert lease() is not None
    assert bytes(t[3].numpy().tobytes()) == sample_bytes(keys[3], "vec", 1000)
    ints = t.view(torch.int32)  # reinterpretation keeps the memory
    assert ints.shape == (16, 250)
    del t
    gc.collect()
    assert lease() is not None  # `ints` shares the storage
    del ints
    gc.collect()
    assert lease() is None
