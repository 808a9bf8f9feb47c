"""A DataLoader worker's arena as the main process maps it (`_transport.Mapping`,
what `shared_arena` batches are read through) stays out of core dumps:
the kernel's own account of the mapping (/proc/self/smaps, VmFlags `dd`)
says MADV_DONTDUMP is set. The control maps the same file plainly: no `dd`."""

import ctypes
import mmap
import os

from ringfeed import _transport


def vm_flags(address):
    """The VmFlags of the mapping of this process that starts at `address`."""
    start = f"{address:08x}-"  # smaps prints addresses as %08lx
    with open("/proc/self/smaps") as f:
        found = False
        for line in f:
            if not found:
                found = line.startswith(start)
                continue
            if line.startswith("VmFlags:"):
                return line.split()[1:]
    raise AssertionError(f"no mapping at {address:x} in /proc/self/smaps")


def test_a_workers_arena_mapped_here_is_kept_out_of_core_dumps(tmp_path):
    arena = tmp_path / "arena"
    length = 4 << 20
    with open(arena, "wb") as f:
        f.truncate(length)
    fd = os.open(arena, os.O_RDWR)
    try:
        st = os.fstat(fd)
        m = _transport.Mapping(os.getpid(), fd, length, (st.st_dev, st.st_ino))
        assert "dd" in vm_flags(m.address), vm_flags(m.address)

        # The control: the same file mapped without the advice.
        plain = mmap.mmap(fd, length, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        anchor = ctypes.c_char.from_buffer(plain)
        try:
            assert "dd" not in vm_flags(ctypes.addressof(anchor))
        finally:
            del anchor
            plain.close()
    finally:
        os.close(fd)
