//! Binding the arena to a NUMA node: `mbind(MPOL_PREFERRED)` on the whole
//! mapping before its pages fault in, so they come from the node of the
//! NIC whose DMA lands in them. Preferred, not bound: when that node runs
//! out of memory the kernel takes pages elsewhere instead of failing.

use memmap2::MmapMut;

/// `MPOL_PREFERRED` (linux/include/uapi/linux/mempolicy.h).
const MPOL_PREFERRED: libc::c_long = 1;
/// `MPOL_F_ADDR` of `get_mempolicy`: the policy of the given address.
#[cfg(test)]
const MPOL_F_ADDR: libc::c_ulong = 1 << 1;

/// Bits per word of a node mask.
const WORD: usize = 64;

/// Prefers NUMA `node` for every page of `map` not yet faulted in.
pub(super) fn prefer_node(map: &mut MmapMut, node: usize) -> std::io::Result<()> {
    let mut mask = vec![0u64; node / WORD + 1];
    mask[node / WORD] |= 1 << (node % WORD);
    // The kernel reads `maxnode - 1` bits (an old off-by-one kept for
    // compatibility; libnuma passes the mask's size + 1 too).
    let maxnode = (mask.len() * WORD + 1) as libc::c_ulong;
    // SAFETY: the range is this mapping, which we own; the mask is a valid
    // array of `mask.len()` words that outlives the call; mbind changes
    // only the placement policy of the range, never its contents.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            map.as_mut_ptr(),
            map.len() as libc::c_ulong,
            MPOL_PREFERRED,
            mask.as_ptr(),
            maxnode,
            0 as libc::c_uint,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The policy mode and the first node of the policy at `addr`.
#[cfg(test)]
pub(super) fn policy_at(addr: *const u8) -> std::io::Result<(libc::c_int, Option<usize>)> {
    let mut mode: libc::c_int = 0;
    let mut mask = [0u64; 16];
    // SAFETY: `mode` and `mask` are writable and live through the call;
    // maxnode is the mask's size in bits; MPOL_F_ADDR only reads the policy
    // of the page at `addr`.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_get_mempolicy,
            &mut mode as *mut libc::c_int,
            mask.as_mut_ptr(),
            (mask.len() * WORD) as libc::c_ulong,
            addr,
            MPOL_F_ADDR,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let node = (0..mask.len() * WORD).find(|&b| mask[b / WORD] & (1 << (b % WORD)) != 0);
    Ok((mode, node))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{Arena, ArenaOptions};

    fn opts(shared: bool) -> ArenaOptions {
        ArenaOptions {
            kind: None,
            lock: None,
            prefault: true,
            shared,
        }
    }

    #[test]
    fn the_arena_is_bound_to_node_0_on_any_machine() {
        // Node 0 exists on every Linux machine, NUMA or not.
        for shared in [false, true] {
            let a = Arena::new_on_node(4 << 20, opts(shared), Some(0)).unwrap();
            assert_eq!(a.report().numa_node, Some(0), "{:?}", a.report().notes);
            let (mode, node) = policy_at(a.base()).unwrap();
            assert_eq!((mode, node), (MPOL_PREFERRED as libc::c_int, Some(0)));
        }
    }

    #[test]
    fn a_node_that_does_not_exist_is_a_note() {
        let a = Arena::new_on_node(4 << 20, opts(false), Some(1000)).unwrap();
        assert_eq!(a.report().numa_node, None);
        assert!(
            a.report()
                .notes
                .iter()
                .any(|n| n.contains("NUMA node 1000")),
            "{:?}",
            a.report().notes
        );
        let plain = Arena::new(4 << 20, opts(false)).unwrap();
        assert_eq!(plain.report().numa_node, None);
    }
}
